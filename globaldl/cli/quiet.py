"""Keep TensorFlow's native start-up chatter (CUDA probes, CPU features) off a worker's stderr."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

# TensorFlow's C++ log threshold: 3 keeps only FATAL. Read once, when TensorFlow loads.
QUIET_TF_LOG_LEVEL = "3"


@contextmanager
def quiet_native_start(verbose: bool) -> Iterator[None]:
    """While TensorFlow (and Horovod) load, send what native code writes to fd 2 to a file.

    TF_CPP_MIN_LOG_LEVEL alone does not do it: the CUDA stub logs before TensorFlow reads it.
    If loading fails, what was held back is written out, so no error is ever hidden. With
    `verbose`, nothing is touched. An explicit TF_CPP_MIN_LOG_LEVEL is kept.
    """
    if verbose:
        yield
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", QUIET_TF_LOG_LEVEL)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            os.write(2, held.read())
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
