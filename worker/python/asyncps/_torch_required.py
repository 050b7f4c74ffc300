"""The `torch` of asyncps.torch, asyncps.overlap and asyncps.torch_update.

PyTorch is optional: `import asyncps` (the client, stores, codecs, data and
metrics) works without it, and these three modules import torch from here, so
that without it they fail with an ImportError that says what to install."""
import sys

try:
    import torch  # noqa: F401  (re-exported)
except ImportError as e:
    raise ImportError(
        "asyncps.torch needs PyTorch, which this Python (%s) cannot import (%s): install it "
        "with pip install 'asyncps[torch]' (or Debian's: apt-get install python3-torch)"
        % (sys.executable, e)) from e
