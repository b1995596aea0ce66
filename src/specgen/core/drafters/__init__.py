"""What proposes draft tokens besides a draft model: EAGLE-3 heads and MTP layers (their models,
file formats and folders), n-gram lookup, and the proposer kinds a profile names."""
