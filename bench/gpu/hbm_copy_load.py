#!/usr/bin/env python3
"""Keeps GPU 0 busy for `--seconds` with device-to-device copies of 2 GiB
buffers (PyTorch), one process at about 99% utilisation: the "busy" load of
the smoke's agent, quiet and overhead steps (scripts/gpu-smoke.sh).
Prints its pid, its start and end (Unix seconds) and the HBM bytes/s it got,
as `key=value` words; the smoke's agent step reads them.

Usage: bench/gpu/hbm_copy_load.py [--seconds 60]
"""
import argparse
import os
import time

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    n = 2 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    start, copies = time.time(), 0
    while time.time() - start < args.seconds:
        for _ in range(20):
            b.copy_(a)
        torch.cuda.synchronize()
        copies += 20
    end = time.time()
    # A copy reads and writes every byte: 2 n bytes of HBM traffic.
    print(f"pid={os.getpid()} start={start:.3f} end={end:.3f} hbm_bytes_per_second={2 * n * copies / (end - start):.6e}")


if __name__ == "__main__":
    main()
