"""hgrn-fairseq: HGRN / HGRN2 gated linear RNNs as a fairseq plugin."""
from setuptools import find_packages, setup

setup(
    name="hgrn_fairseq",
    version="0.1.0",
    description="HGRN and HGRN2 gated linear RNN models, Triton kernels and recipes as a fairseq plugin",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["hgrn_fairseq", "hgrn_fairseq.*"]),
    install_requires=[
        "fairseq-fixed==0.12.3.1",  # imports as `fairseq`; stock 0.12.2 does not import on Python >= 3.11
        "torch>=2.4",
        "triton; platform_system == 'Linux'",
        "hydra-core",
        "sentencepiece",
        "timm",
        # plots, logs and progress are part of what the commands promise, not optional extras
        "matplotlib",
        "tensorboard",
        "tensorboardX",  # fairseq logs "Please install tensorboardX" at start-up without it
        "tqdm",
        "Pillow",
        "safetensors",  # python -m hgrn_fairseq.export / load_exported: weights to share, without pickle
    ],
    entry_points={"console_scripts": ["hgrn-export = hgrn_fairseq.export:main"]},
    extras_require={
        # (pytest-xdist >= 3.8: scripts/test.sh runs each set with --dist loadfile)
        "test": ["pytest", "pytest-xdist>=3.8", "numpy"],
        # zero-shot evaluation (hgrn_fairseq.evaluation.lm_eval); the test command installs it
        "eval": ["lm_eval==0.4.13"],
        "plot": [],  # kept so that `pip install .[plot]` still works; matplotlib is a dependency now
    },
)
