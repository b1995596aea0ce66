"""`specgen train-head`: the corpus, the target's features, the plan and the training loop of an
EAGLE-3 head."""
