"""HGRN image classification: timm-registered models and the DeiT-style training entry point.

``import hgrn_fairseq.image`` registers the models with timm (``hgrn1d_vit_tiny``, ``hgrn2_vit_small``,
...; see ``models.py``). This package imports timm, so nothing under ``models/`` or ``tasks/`` (which
fairseq imports at start-up) imports it.
"""
from .models import ARCHS, HgrnVit

__all__ = ["ARCHS", "HgrnVit"]
