"""nn.Modules of HGRN / HGRN2, usable from plain PyTorch (no fairseq imports here)."""
from .glu import GLU, get_activation
from .hgru import HGRU, theta_init
from .hgru2 import HGRU2, hgrn2_log_decay
from .lower_bound import LayerLowerBounds

__all__ = ["GLU", "get_activation", "HGRU", "theta_init", "HGRU2", "hgrn2_log_decay", "LayerLowerBounds"]
