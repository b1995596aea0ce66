"""Loading a pair: checkpoints, weights (specgen's own model step or transformers'), tokenizers,
chat templates, the context window and detokenisation."""
