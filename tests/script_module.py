"""Import a script that is not a package module (scripts/*.py, bench/*.py) by its path."""
import importlib.util
import os


def load_script(path: str):
    """The module of the Python file at ``path``, named after the file."""
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
