"""Data preparation shared by the data_prep/ entry points: tokenizer, binarizer, the Pathfinder generator."""
