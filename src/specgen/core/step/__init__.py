"""specgen's own model step: one forward per model family over a kernel table (ops.py), whose
query rows carry their own positions and visible cache slots (rows.py). core/models/loading.py loads a
checkpoint here when config.py covers it, and through transformers otherwise."""
