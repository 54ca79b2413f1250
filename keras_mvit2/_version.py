"""The package version, in a module of its own: modules read it without importing the package
root (which imports every sub-package), and setuptools reads it without importing anything."""

__version__ = "0.2.0"
