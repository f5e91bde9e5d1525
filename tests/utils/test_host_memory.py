"""Host buffers advised for transparent huge pages (``rlflow.utils.host_memory``), on this kernel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlflow.utils.host_memory import ADVISE_MIN_BYTES, cat_host, copy_to_host, empty_host

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# Run in a fresh process so glibc's heap state from other tests cannot decide where the buffers land.
_PROBE = r"""
import torch
from rlflow.utils.host_memory import empty_host

def anon_huge_kib(tensor):  # summed over every mapping the tensor overlaps: the advice splits its mapping
    first, last = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start < last and first < end
            elif inside and head == "AnonHugePages:":
                total += int(line.split()[1])
    return total

size = 64 * 2**20  # above glibc's largest mmap threshold: both buffers are fresh mappings
plain = torch.empty(size, dtype=torch.uint8).fill_(1)
advised = empty_host((size,), torch.uint8).fill_(1)
print(anon_huge_kib(plain), anon_huge_kib(advised))
"""


def _thp_mode() -> str:
    text = THP_MODE.read_text() if THP_MODE.exists() else ""
    return text[text.find("[") + 1 : text.find("]")] if "[" in text else "absent"


def test_large_host_buffers_fault_in_huge_pages():
    """Huge pages where the kernel offers them; elsewhere the advice is a silent no-op and the buffer works."""
    mode = _thp_mode()
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    plain_kib, advised_kib = (int(x) for x in out.stdout.split())
    if mode not in ("madvise", "always"):  # 'never' or no THP: ordinary pages, and no error on the way
        assert advised_kib == plain_kib == 0, (mode, plain_kib, advised_kib)
        return
    assert advised_kib >= 60 * 1024, f"only {advised_kib} KiB of the 64 MiB advised buffer are huge pages"
    if mode == "madvise":  # the control: without the advice this kernel hands out 4 KiB pages
        assert plain_kib == 0, plain_kib


def test_host_copies_and_joins_equal_torch():
    big = torch.randn(ADVISE_MIN_BYTES // 4 + 17, 3)
    copied = copy_to_host(big[:, 1])
    assert torch.equal(copied, big[:, 1]) and copied.is_contiguous() and copied.data_ptr() != big.data_ptr()
    parts = [torch.randn(5, 4), torch.randn(0, 4), torch.randn(3, 4)]
    for dim_parts, dim in ((parts, 0), ([p.T for p in parts], 1), ([p.T for p in parts], -1), ([big, big], 0)):
        assert torch.equal(cat_host(dim_parts, dim), torch.cat(dim_parts, dim))


def test_what_host_joins_cannot_take_goes_to_plain_torch_cat():
    mixed = [torch.ones(2, dtype=torch.int64), torch.full((2,), 0.5)]
    assert torch.equal(cat_host(mixed), torch.cat(mixed))  # promoted to float like torch.cat
    leaf = torch.ones(3, requires_grad=True)
    joined = cat_host([leaf, leaf])
    joined.sum().backward()
    assert joined.requires_grad and leaf.grad.tolist() == [2.0, 2.0, 2.0]
    with pytest.raises((RuntimeError, IndexError)):
        cat_host([torch.ones(2, 3), torch.ones(2, 4)])
    with pytest.raises((RuntimeError, IndexError)):
        cat_host([torch.ones(2)], dim=3)
