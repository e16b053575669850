"""The two kinds of attention pattern (block layouts, token masks): two registries, one lookup that takes the kind,
one docs table, and every list of them derived from the registries (a new layout is one class + one example
entry: docs/model.md, "Block layout or token mask?")."""

from __future__ import annotations

import pytest
import torch

from model.attention import patterns as P
from model.attention.layouts import BLOCK_LAYOUTS, SparsityConfig, from_ds_config, register_layout
from model.attention.token_patterns import TOKEN_MASKS, NoParams, register_pattern
from model.config import AttentionConfig

SHARED = sorted(set(BLOCK_LAYOUTS) & set(TOKEN_MASKS))


def test_the_kinds_registries_are_the_ones_the_code_fills():
    assert P.REGISTRIES[P.BLOCK_LAYOUT] is BLOCK_LAYOUTS and P.REGISTRIES[P.TOKEN_MASK] is TOKEN_MASKS
    assert {"fixed", "bigbird"} <= set(SHARED)  # the names the issue found in both
    assert P.names(P.BLOCK_LAYOUT) == sorted(BLOCK_LAYOUTS) and P.names(P.TOKEN_MASK) == sorted(TOKEN_MASKS)


@pytest.mark.parametrize("name", SHARED)
def test_a_name_both_kinds_register_needs_the_kind(name):
    with pytest.raises(ValueError, match="names both a block layout") as e:
        P.lookup(name)
    assert f'attention.sparsity: {{"mode": "{name}"}}' in str(e.value)
    assert f'attention.token_mask: {{"pattern": "{name}"}}' in str(e.value)
    assert P.lookup(name, P.BLOCK_LAYOUT) is BLOCK_LAYOUTS[name]
    assert P.lookup(name, P.TOKEN_MASK) is TOKEN_MASKS[name]


def test_a_name_of_one_kind_resolves_bare_and_the_wrong_key_names_the_right_one():
    assert P.lookup("blockbert") is BLOCK_LAYOUTS["blockbert"]
    assert P.lookup("star") is TOKEN_MASKS["star"]
    with pytest.raises(
        ValueError,
        match=r"attention.sparsity: .*'star' is not a registered block layout .*it is a token mask: set "
        r'attention.token_mask: \{"pattern": "star"\}',
    ):
        AttentionConfig(sparsity={"mode": "star"})
    with pytest.raises(
        ValueError,
        match=r"attention.token_mask.pattern: 'bslongformer' is not a registered token mask .*it is a block "
        r'layout: set attention.sparsity: \{"mode": "bslongformer"\}',
    ):
        AttentionConfig(token_mask={"pattern": "bslongformer"})
    with pytest.raises(NotImplementedError, match="sparse_attention mode 'triangle' is not supported"):
        from_ds_config({"mode": "triangle"}, 2)  # DeepSpeed's exception type for a mode it does not have
    with pytest.raises(ValueError, match="neither a block layout .* nor a token mask"):
        P.lookup("triangle")
    with pytest.raises(ValueError, match="pattern kind must be one of"):
        P.lookup("fixed", "layout")


def test_a_new_layout_and_a_new_token_mask_reach_every_list(capsys):
    """The walk-through: registering is all it takes for the config, the benchmarks' choices, the docs table and the
    tests' parameters (which then ask for the one example entry)."""
    from benchmarks.attention import cli, retained_memory
    from benchmarks.attention import layouts as bench_layouts
    from tests.registry_cases import missing_layout_examples
    from tools import config_docs

    @register_layout
    class _DiagonalBlocks(SparsityConfig):
        """Each query block attends its own key block only (a test layout)."""

        mode = "test_diagonal_blocks"

        def make_layout(self, seq_len: int) -> torch.Tensor:
            layout = self.setup_layout(seq_len)
            layout[:] = torch.eye(layout.shape[-1], dtype=layout.dtype)
            return layout

    @register_pattern("test_first_token")
    def _first_token(p: NoParams, num_heads: int, n: int, gen: torch.Generator, layer: int) -> torch.Tensor:
        """Every query attends the first token only (a test mask)."""
        m = torch.zeros(1, n, n, dtype=torch.bool)
        m[:, :, 0] = True
        return m

    try:
        assert P.lookup("test_diagonal_blocks") is _DiagonalBlocks
        assert P.lookup("test_first_token") is TOKEN_MASKS["test_first_token"]
        cfg = AttentionConfig(sparsity={"mode": "test_diagonal_blocks", "block": 16})
        assert isinstance(cfg.for_layer(0, 4)[1], _DiagonalBlocks)
        AttentionConfig(token_mask={"pattern": "test_first_token"})
        # the benchmarks' choices
        assert "test_diagonal_blocks" in bench_layouts.layouts()
        assert bench_layouts.layouts()["test_diagonal_blocks"]().num_heads == bench_layouts.HEADS  # at its defaults
        assert retained_memory.families()["test_diagonal_blocks"] == {"mode": "test_diagonal_blocks"}
        for measure, name in (
            ("time", "test_diagonal_blocks"),
            ("memory", "test_diagonal_blocks"),
            ("masks", "test_first_token"),
        ):
            with pytest.raises(SystemExit):
                cli._main(["--measure", measure, "--help"])
            assert name in capsys.readouterr().out
        # the docs table
        table = config_docs.pattern_table()
        assert "| `test_diagonal_blocks` | block layout |" in table and "| `test_first_token` | token mask |" in table
        # the tests' parameters: the guard asks for the one example entry
        assert missing_layout_examples() == ["test_diagonal_blocks"]
    finally:
        del BLOCK_LAYOUTS["test_diagonal_blocks"], TOKEN_MASKS["test_first_token"]
    assert missing_layout_examples() == []
