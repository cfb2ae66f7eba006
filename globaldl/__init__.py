"""globaldl: one TensorFlow model trained across many small devices with Horovod."""

import os

# Horovod 0.28.1 needs legacy Keras variables (Keras 3 variables have no `.ref()`, horovod
# issue #4290), and tensorflow-model-optimization needs tf-keras too. This must be set before
# TensorFlow is first imported, so it lives at the package root.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"
__all__ = ["__version__"]
