"""Every sample of the gallery runs (small shapes); samples assert their own errors."""
import pytest

from samples import SAMPLES, load


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_runs(name, capsys):
    load(name).main(small=True)
    out = capsys.readouterr().out
    assert "error" in out  # every sample reports its error against numpy
