"""The dataset conformance suite. A dataset package proves itself in a few lines:

    class TestMyDataset(DatasetConformance):
        dataset_name = "mine"

        def sample_input(self, folder):   # write a small input it can load
            ...; return path

It checks that the source loads the sample into a corpus whose train and validation
tokens lie inside its vocabulary, that batches are reproducible next-token windows,
and that an input that does not exist is refused with a one-line `DataError`.
"""

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

SAMPLE_TEXT = "The quick brown fox jumps over the lazy dog. " * 40


class DatasetConformance:
    dataset_name: ClassVar[str]

    def sample_input(self, folder: Path) -> Path | None:
        """A small input the source can load (default: one UTF-8 text file)."""
        path = folder / "sample.txt"
        path.write_text(SAMPLE_TEXT, encoding="utf-8")
        return path

    @pytest.fixture
    def source(self) -> Any:
        from pcp_core import plugins

        return plugins.host().dataset(self.dataset_name)

    @pytest.fixture
    def corpus(self, source: Any, tmp_path: Path) -> Any:
        return source.load(self.sample_input(tmp_path))

    def test_tokens_lie_in_the_vocabulary(self, source: Any, corpus: Any) -> None:
        assert source.name == self.dataset_name
        assert corpus.vocab_size > 1
        for split in (corpus.train, corpus.validation):
            assert len(split) > 16 and np.issubdtype(split.dtype, np.integer)
            assert int(split.min()) >= 0 and int(split.max()) < corpus.vocab_size

    def test_batches_are_reproducible_next_token_windows(self, corpus: Any) -> None:
        x, y = corpus.batches("train", 2, 3, 8, (0, 1))
        assert x.shape == y.shape == (2, 3, 8) and x.dtype == np.int32
        np.testing.assert_array_equal(x[..., 1:], y[..., :-1])
        again, _ = corpus.batches("train", 2, 3, 8, (0, 1))
        np.testing.assert_array_equal(x, again)

    def test_missing_input_is_a_one_line_error(self, source: Any, tmp_path: Path) -> None:
        from pcp_core.data.errors import DataError

        with pytest.raises(DataError) as error:
            source.load(tmp_path / "does-not-exist")
        assert "\n" not in str(error.value) and "does-not-exist" in str(error.value)
