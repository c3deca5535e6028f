"""Entry points that turn raw downloads into what training reads (run as ``python data_prep/NAME.py``)."""
