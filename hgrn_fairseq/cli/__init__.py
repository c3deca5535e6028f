"""Command-line tools that scripts/ runs: their code lives here, scripts/*.py are the entry points."""
