#!/usr/bin/env python3
"""Renders the Kubernetes manifests: same options as `psrun --backend k8s`.

  launch/k8s/render.py --servers 2 --workers 4 --config launch/configs/fashion_ssp.flags \
      --render out/k8s [--format json] [--image asyncps:latest] [-- extra worker flags]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))

from pslaunch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["--backend", "k8s"] + sys.argv[1:]))
