"""The core's own model, dataset and algorithm pass the suites a plugin would."""

from typing import ClassVar

from pcp_core.testing import AlgorithmConformance, DatasetConformance, ModelConformance


class TestNanoGPT(ModelConformance):
    model_name = "nanogpt"
    small_config: ClassVar[dict[str, int]] = {
        "n_layer": 1,
        "n_head": 2,
        "n_embd": 32,
        "block_size": 16,
    }


class TestCharsDataset(DatasetConformance):
    dataset_name = "chars"


class TestLocalAlgorithm(AlgorithmConformance):
    algorithm_name = "local"
