"""Unit tests of the physical unified KV pool: typed views, scatter/gather, block copies, export/import."""

from __future__ import annotations

import pytest
import torch
from llmfleet.kvblocks.shapes import KvShape
from llmfleet.kvblocks.storage import KvStorage, dtype_name

A = KvShape(num_layers=2, num_kv_heads=2, head_dim=16, dtype="float32")  # 512 B/token
B = KvShape(num_layers=3, num_kv_heads=1, head_dim=24, dtype="float16")  # 288 B/token
BB = 2304  # T_A = 4 (256 B tail), T_B = 8 (no tail)


def filled(storage: KvStorage, model: str, shape: KvShape, blocks: list[int], n: int, seed: int = 0):
    """Write n random tokens (all layers) of a sequence with block table ``blocks``; return K, V [L, H, n, D]."""
    gen = torch.Generator().manual_seed(seed)
    dtype = storage.view(model).dtype
    t_m = storage.tokens_per_block(model)
    ks = torch.randn(shape.num_layers, n, shape.num_kv_heads, shape.head_dim, generator=gen).to(dtype)
    vs = torch.randn(shape.num_layers, n, shape.num_kv_heads, shape.head_dim, generator=gen).to(dtype)
    pos = torch.arange(n)
    sb = torch.tensor(blocks)[pos // t_m]
    for layer in range(shape.num_layers):
        storage.write(model, layer, sb, pos % t_m, ks[layer], vs[layer])
    return ks.transpose(1, 2), vs.transpose(1, 2)


# ------------------------------------------------------------------------------------ construction
@pytest.mark.parametrize(("num_blocks", "block_bytes"), [(0, 1024), (-1, 1024), (4, 0), (4, 1000), (4, 8)])
def test_rejects_bad_geometry(num_blocks, block_bytes):
    with pytest.raises(ValueError):
        KvStorage(num_blocks, block_bytes)


def test_facts():
    s = KvStorage(10, BB)
    assert (s.num_blocks, s.block_bytes, s.nbytes, s.device) == (10, BB, 10 * BB, torch.device("cpu"))
    assert s.pool.dtype == torch.uint8 and s.pool.shape == (10, BB)
    assert dtype_name(torch.bfloat16) == "bfloat16" and dtype_name("float16") == "float16"
    with pytest.raises(ValueError):
        dtype_name(torch.int32)


def test_register_makes_typed_views_of_the_same_bytes():
    s = KvStorage(6, BB)
    va = s.register("a", A)
    vb = s.register("b", B)
    assert va.shape == (6, 2, 2, 2, 4, 16) and va.dtype == torch.float32
    assert vb.shape == (6, 3, 2, 1, 8, 24) and vb.dtype == torch.float16
    assert va.data_ptr() == vb.data_ptr() == s.pool.data_ptr()  # views, no copy
    assert va.stride(0) * 4 == vb.stride(0) * 2 == BB  # rows are block_bytes apart
    assert s.tokens_per_block("a") == 4 and s.tokens_per_block("b") == 8
    assert s.models == ("a", "b") and "a" in s and "c" not in s
    s.pool.zero_()  # the pool starts uninitialised
    va[3, 1, 1, 1, 3, 15] = 1.0  # last element of A's slab in block 3
    row = s.pool[3]
    assert (
        row[4 * A.bytes_per_token - 4 : 4 * A.bytes_per_token].tolist()
        == torch.tensor([1.0]).view(torch.uint8).tolist()
    )
    assert int(row[4 * A.bytes_per_token :].sum()) == 0  # the tail is untouched
    va.fill_(0.5)
    assert int(s.pool[:, 4 * A.bytes_per_token :].sum()) == 0


def test_register_is_idempotent_per_shape_and_unregister():
    s = KvStorage(4, BB)
    v1 = s.register("a", A)
    assert s.register("a", A) is v1
    with pytest.raises(ValueError, match="already registered"):
        s.register("a", B)
    s.unregister("a")
    assert "a" not in s
    with pytest.raises(KeyError, match="not registered"):
        s.unregister("a")
    with pytest.raises(KeyError):
        s.gather("a", 0, [0], 1)
    with pytest.raises(ValueError, match="cannot hold one token"):
        KvStorage(4, 256).register("a", A)


# --------------------------------------------------------------------------------- write / gather
def test_write_gather_round_trip_across_block_boundaries():
    s = KvStorage(12, BB)
    s.register("a", A)
    blocks = [7, 2, 9, 0]  # 16 slots, 14 used
    k, v = filled(s, "a", A, blocks, 14)
    for layer in range(A.num_layers):
        gk, gv = s.gather("a", layer, blocks, 14)
        assert gk.shape == (2, 14, 16)
        assert torch.equal(gk, k[layer]) and torch.equal(gv, v[layer])
        gk5, _ = s.gather("a", layer, torch.tensor(blocks[:2]), 5)
        assert torch.equal(gk5, k[layer, :, :5])
    with pytest.raises(ValueError):
        s.gather("a", 0, blocks, 17)


def test_write_overwrites_single_slots_and_validates_shapes():
    s = KvStorage(4, BB)
    s.register("a", A)
    k, _ = filled(s, "a", A, [1, 3], 8)
    new = torch.full((1, 2, 16), 7.0)
    s.write("a", 1, torch.tensor([3]), torch.tensor([2]), new, -new)  # position 6
    gk, gv = s.gather("a", 1, [1, 3], 8)
    assert torch.equal(gk[:, 6], new[0]) and torch.equal(gv[:, 6], -new[0])
    assert torch.equal(gk[:, :6], k[1, :, :6]) and torch.equal(gk[:, 7], k[1, :, 7])
    assert torch.equal(s.gather("a", 0, [1, 3], 8)[0], k[0])  # other layer untouched
    with pytest.raises(ValueError, match="same n tokens"):
        s.write("a", 0, torch.tensor([1, 1]), torch.tensor([0, 1]), new, new)


def test_models_sharing_the_pool_do_not_interfere():
    s = KvStorage(8, BB)
    s.register("a", A)
    s.register("b", B)
    _, va = filled(s, "a", A, [5, 1], 7, seed=1)
    kb, vb = filled(s, "b", B, [2, 6, 0], 20, seed=2)
    for layer in range(A.num_layers):
        assert torch.equal(s.gather("a", layer, [5, 1], 7)[1], va[layer])
    for layer in range(B.num_layers):
        gk, gv = s.gather("b", layer, [2, 6, 0], 20)
        assert torch.equal(gk, kb[layer]) and torch.equal(gv, vb[layer])
        assert gk.dtype == torch.float16


# ------------------------------------------------------------------------------------ block copies
def test_copy_block_and_copy_blocks():
    s = KvStorage(8, BB)
    s.register("a", A)
    k, _ = filled(s, "a", A, [1, 2], 8)
    s.copy_block(2, 5)
    assert torch.equal(s.pool[5], s.pool[2])
    assert torch.equal(s.gather("a", 0, [1, 5], 8)[0], k[0])
    s.copy_blocks([1, 2], [6, 7])
    assert torch.equal(s.pool[6:8], s.pool[1:3])
    with pytest.raises(IndexError):
        s.copy_block(0, 8)
    with pytest.raises(IndexError):
        s.copy_blocks([0], [-1])
    with pytest.raises(ValueError):
        s.copy_blocks([0, 1], [2])


# ---------------------------------------------------------------------------------- export / import
@pytest.mark.parametrize("shape", [A, B], ids=["fp32", "fp16"])
def test_export_import_into_other_block_size(shape):
    src = KvStorage(10, BB)
    src.register("m", shape)
    k, v = filled(src, "m", shape, [4, 8, 1, 3, 9, 0], 19)
    data = src.export_tokens("m", [4, 8, 1, 3, 9, 0], 0, 19)
    assert len(data) == 19 * shape.bytes_per_token == src.bytes_for_tokens("m", 19)
    # canonical layout [L, 2, H, n, D], C-contiguous, model dtype, little-endian
    canon = torch.frombuffer(bytearray(data), dtype=src.view("m").dtype)
    assert torch.equal(canon.view(shape.num_layers, 2, shape.num_kv_heads, 19, shape.head_dim)[:, 0], k)

    dst = KvStorage(5, 4096)  # other T_m
    dst.register("m", shape)
    assert dst.tokens_per_block("m") != src.tokens_per_block("m")
    table = [3, 0, 4, 1][: shape.blocks_for(19, 4096)]
    assert dst.import_tokens("m", table, 0, data) == 19
    for layer in range(shape.num_layers):
        gk, gv = dst.gather("m", layer, table, 19)
        assert torch.equal(gk, k[layer]) and torch.equal(gv, v[layer])
    assert dst.export_tokens("m", table, 0, 19) == data


def test_export_import_sub_ranges_in_chunks():
    src = KvStorage(10, BB)
    src.register("a", A)
    blocks = [9, 8, 7, 6, 5]
    k, v = filled(src, "a", A, blocks, 18)
    dst = KvStorage(6, 1024)  # T = 2
    dst.register("a", A)
    table = [0, 1, 2, 3, 4, 5]  # 12 slots
    for lo, hi in [(0, 5), (5, 6), (6, 12)]:
        dst.import_tokens("a", table, lo, src.export_tokens("a", blocks, lo, hi), num_tokens=hi - lo)
    for layer in range(2):
        gk, gv = dst.gather("a", layer, table, 12)
        assert torch.equal(gk, k[layer, :, :12]) and torch.equal(gv, v[layer, :, :12])
    assert src.export_tokens("a", blocks, 3, 3) == b""
    assert dst.import_tokens("a", table, 0, b"") == 0


def test_import_validates_byte_length_and_range():
    s = KvStorage(4, BB)
    s.register("a", A)
    with pytest.raises(ValueError, match=r"1000 bytes, expected a multiple of 512"):
        s.import_tokens("a", [0, 1], 0, bytes(1000))
    with pytest.raises(ValueError, match=r"1024 bytes, expected 3 tokens × 512"):
        s.import_tokens("a", [0, 1], 0, bytes(1024), num_tokens=3)
    with pytest.raises(ValueError, match="outside 2 blocks"):
        s.import_tokens("a", [0, 1], 6, bytes(3 * 512))
    with pytest.raises(ValueError, match="outside"):
        s.export_tokens("a", [0], 2, 5)
    with pytest.raises(IndexError):
        s.export_tokens("a", [4], 0, 1)
    s.import_tokens("a", [0, 1], 5, memoryview(bytes(3 * 512)))  # read-only buffers are fine
