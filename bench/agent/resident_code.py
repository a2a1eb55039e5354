#!/usr/bin/env python3
"""How much of each section of a running agent's binary is resident.

Reads /proc/PID/pagemap over the mappings of the process's executable and
counts the present pages that fall in each ELF section (readelf -S), so the
packed hot code (.text.vtax_hot), the rest of .text, .rodata and the
relocations can be told apart. Needs root (pagemap hides frames, not presence,
from others, but only root reads another user's).

    sudo bench/agent/resident_code.py PID
"""
import os
import re
import struct
import subprocess
import sys


def sections(binary):
    """(name, address, size) of the sections loaded at an address."""
    out = subprocess.run(["readelf", "-S", "-W", binary], capture_output=True, text=True,
                         check=True).stdout
    spec = re.compile(r"^\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)")
    found = []
    for line in out.splitlines():
        match = spec.match(line)
        if match and int(match.group(2), 16):
            found.append((match.group(1), int(match.group(2), 16), int(match.group(3), 16)))
    return found


def main():
    pid = int(sys.argv[1])
    binary = os.readlink(f"/proc/{pid}/exe")
    mappings = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == binary:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                mappings.append((start, end, int(fields[2], 16)))
    # The mapping at file offset 0 sits at the load address (PIE or not).
    load = next(start for start, _, offset in mappings if offset == 0)
    resident = {}
    layout = sections(binary)
    with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        for start, end, _ in mappings:
            pages = (end - start) // 4096
            pagemap.seek(start // 4096 * 8)
            entries = pagemap.read(pages * 8)
            for i in range(pages):
                if not struct.unpack_from("<Q", entries, i * 8)[0] >> 63:
                    continue
                page = start + i * 4096 - load
                name = next((n for n, a, s in layout if a < page + 4096 and page < a + s), "other")
                resident[name] = resident.get(name, 0) + 4096
    print(f"{binary} (pid {pid})")
    for name, _, size in layout:
        if name in resident:
            print(f"  {name:20s} {resident[name] / 2**20:6.2f} MiB resident of {size / 2**20:6.2f}")
    print(f"  {'total':20s} {sum(resident.values()) / 2**20:6.2f} MiB")


if __name__ == "__main__":
    main()
