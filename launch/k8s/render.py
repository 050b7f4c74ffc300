#!/usr/bin/env python3
"""Renders the Kubernetes manifests: same options as `psrun --backend k8s`.

  launch/k8s/render.py --servers 2 --workers 4 --config launch/configs/fashion_ssp.flags \
      --render out/k8s [--format json] [--image asyncps:latest] [-- extra worker flags]

A thin wrapper: it runs launch/psrun --backend k8s with its arguments.
"""
import os
import sys

PSRUN = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "psrun")

if __name__ == "__main__":
    os.execv(sys.executable, [sys.executable, PSRUN, "--backend", "k8s"] + sys.argv[1:])
