"""Training recipes of the papers' experiments: the one source that the shell scripts, the hydra configs,
the model archs and the results tables read."""
