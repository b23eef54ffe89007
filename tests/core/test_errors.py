"""Errors keep their fields when pickled: sweep workers raise them in another process."""

import pickle

from tessera.core.errors import InputFileError, InvalidRequestError, UnknownGpuModelError


def test_errors_cross_process_boundaries_with_their_fields() -> None:
    for error in (
        InvalidRequestError("cpu_milli", "must be >= 0"),
        UnknownGpuModelError("gpu_type", "unknown GPU type 'X'"),
        InputFileError("pods.csv", 7, "num_gpu", "not an integer"),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error) and vars(copy) == vars(error)
