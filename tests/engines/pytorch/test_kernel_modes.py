"""The calling thread's kernel modes: `decode_rows_on_registers` keeps a step's decode rows off the tile unit."""

from __future__ import annotations

import threading

from engines.pytorch import kernel_modes, packed_blocks


def test_decode_rows_stay_on_the_register_kernels_when_asked() -> None:
    """Forced path (any CPU: the split is decided in Python): a weight whose panels use the tile unit sends more
    than 16 decode rows there, except inside `decode_rows_on_registers` (a step with a seeded request), where every
    decode row keeps the register kernels' bits whatever the batch; prompt rows use the tile unit either way, and
    another thread's steps are not affected."""
    packed = packed_blocks._Packed([], 64, tile_unit=True)
    assert packed.row_parts(24, None) == [(0, 24, 1)]
    assert packed.row_parts(40, 24) == [(0, 40, 1)]
    assert packed.row_parts(8, None) == [(0, 8, 0)]
    with kernel_modes.decode_rows_on_registers():
        assert packed.row_parts(24, None) == [(0, 24, 0)]
        assert packed.row_parts(40, 24) == [(0, 24, 0), (24, 40, 1)]
        elsewhere: list[list[tuple[int, int, int]]] = []
        thread = threading.Thread(target=lambda: elsewhere.append(packed.row_parts(24, None)))
        thread.start()
        thread.join()
        assert elsewhere == [[(0, 24, 1)]]
    assert packed.row_parts(24, None) == [(0, 24, 1)]
