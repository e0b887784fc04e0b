"""Every sample of the gallery runs (small shapes); samples assert their own errors."""
import pytest

from samples import SAMPLES, load


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_runs(name, capsys):
    load(name).main(small=True)
    out = capsys.readouterr().out
    assert "error" in out  # every sample reports its error against numpy


def test_readme_example_runs():
    """The README's first-graph example runs as written and fuses."""
    import re
    from pathlib import Path

    import numpy as np

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = re.search(r"## A first graph\n\n```python\n(.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    result, feeds, n, k, group = (scope[name] for name in ("result", "feeds", "n", "k", "group"))
    assert [r.partition.get_kind() for r in result.partitions] == ["matmul_compressed"]
    w = feeds[0].astype(np.float64) * 0.01
    expected = feeds[3].astype(np.float64) @ w.T
    np.testing.assert_allclose(result.outputs[4], expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
