"""Reading LLM request traces: the Azure LLM format, the Splitwise format, and one precise error per bad file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tessera.core.errors import InputFileError
from tessera.sim.serving.trace import read_llm_trace

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
SPLITWISE_HEADER = "request_id,request_type,application_id,arrival_timestamp,batch_size,prompt_size,token_size"
SHARED_CONV = Path(__file__).parents[4] / "shared/traces/azure-llm/AzureLLMInferenceTrace_conv.csv"


def _write(tmp_path: Path, *lines: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _error(path: Path) -> InputFileError:
    with pytest.raises(InputFileError) as caught:
        read_llm_trace(path)
    return caught.value


def test_reads_the_azure_format_relative_to_the_first_arrival(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        AZURE_HEADER,
        "2023-11-16 18:15:46.6805900,374,44",
        "2023-11-16 18:15:50.9951690,396,109",
        "2023-11-16 18:16:46.6805900,879,55",
    )
    trace = read_llm_trace(path)

    assert trace.format == "azure"
    assert trace.name == "trace"
    np.testing.assert_allclose(trace.arrival_s, [0.0, 4.314579, 60.0], atol=1e-9)
    assert trace.prompt_tokens.tolist() == [374, 396, 879]
    assert trace.output_tokens.tolist() == [44, 109, 55]
    # Span 60 s over 2 gaps: one more mean gap (30 s) closes the cycle.
    assert trace.duration_s == pytest.approx(90.0)
    assert trace.rate_per_s == pytest.approx(3 / 90.0)


def test_out_of_order_rows_are_sorted_stably_with_their_token_counts(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        AZURE_HEADER,
        "2023-11-16 18:00:10,10,1",
        "2023-11-16 18:00:00,20,2",
        "2023-11-16 18:00:10,30,3",
        "2023-11-16T18:00:05.5,40,4",
    )
    trace = read_llm_trace(path)

    assert trace.arrival_s.tolist() == [0.0, 5.5, 10.0, 10.0]
    assert trace.prompt_tokens.tolist() == [20, 40, 10, 30]
    assert trace.output_tokens.tolist() == [2, 4, 1, 3]


def test_zero_generated_tokens_read_as_one_and_are_counted(tmp_path: Path) -> None:
    path = _write(tmp_path, AZURE_HEADER, "2023-11-16 18:00:00,5,0", "2023-11-16 18:00:01,5,7")
    trace = read_llm_trace(path)

    assert trace.output_tokens.tolist() == [1, 7]
    assert trace.zero_output_rows == 1


def test_header_case_column_order_blank_lines_and_bom_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "\ufeffgeneratedtokens, timestamp ,CONTEXTTOKENS\n\n3,2023-11-16 18:00:00,9\n\n4,2023-11-16 18:00:02,8\n"
    )
    trace = read_llm_trace(path)

    assert trace.prompt_tokens.tolist() == [9, 8]
    assert trace.output_tokens.tolist() == [3, 4]
    assert trace.arrival_s.tolist() == [0.0, 2.0]


def test_reads_the_splitwise_format(tmp_path: Path) -> None:
    path = _write(tmp_path, SPLITWISE_HEADER, "0,2,0,0.5,1,1254,419", "1,2,0,0.25,1,454,40", "2,2,0,2.25,1,2700,77")
    trace = read_llm_trace(path)

    assert trace.format == "splitwise"
    assert trace.arrival_s.tolist() == [0.0, 0.25, 2.0]
    assert trace.prompt_tokens.tolist() == [454, 1254, 2700]
    assert trace.output_tokens.tolist() == [40, 419, 77]


def test_a_single_row_trace_lasts_one_second(tmp_path: Path) -> None:
    trace = read_llm_trace(_write(tmp_path, AZURE_HEADER, "2023-11-16 18:00:00,5,3"))
    assert len(trace) == 1
    assert trace.duration_s == 1.0


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [
        ("2023-11-16 18:00:01,12", "GeneratedTokens", "missing"),
        ("2023-11-16 18:00:01", "ContextTokens", "missing"),
        ("2023-11-16 18:00:01,12,5,9", "column 4", "extra"),
        ("16/11/2023 18:00:01,12,5", "TIMESTAMP", "not a timestamp"),
        ("2023-11-16,12,5", "TIMESTAMP", "not a timestamp"),
        ("2023-11-16 18:00:01Z,12,5", "TIMESTAMP", "not a timestamp"),
        ("2023-11-16 18:00:01+01:00,12,5", "TIMESTAMP", "not a timestamp"),
        ("2023-13-16 18:00:01,12,5", "TIMESTAMP", "not a valid timestamp"),
        ("2023-11-16 25:00:01,12,5", "TIMESTAMP", "not a valid timestamp"),
        (",12,5", "TIMESTAMP", "not a timestamp"),
        ("2023-11-16 18:00:01,0,5", "ContextTokens", "must be 1..10,000,000"),
        ("2023-11-16 18:00:01,99999999999999999999999,5", "ContextTokens", "must be 1..10,000,000"),
        ("2023-11-16 18:00:01,12,10000001", "GeneratedTokens", "must be 0..10,000,000"),
        ("2023-11-16 18:00:01,-4,5", "ContextTokens", "not a whole number"),
        ("2023-11-16 18:00:01,12.5,5", "ContextTokens", "not a whole number"),
        ("2023-11-16 18:00:01,abc,5", "ContextTokens", "not a whole number"),
        ("2023-11-16 18:00:01,,5", "ContextTokens", "missing value"),
        ("2023-11-16 18:00:01,12,-1", "GeneratedTokens", "not a whole number"),
        ("2023-11-16 18:00:01,12,1e3", "GeneratedTokens", "not a whole number"),
    ],
)
def test_a_bad_azure_row_names_file_line_and_field(tmp_path: Path, row: str, field: str, words: str) -> None:
    # The bad row is line 4 as an editor shows it: header, a good row, a blank line, then the row.
    path = tmp_path / "bad.csv"
    path.write_text(f"{AZURE_HEADER}\n2023-11-16 18:00:00,10,2\n\n{row}\n2023-11-16 18:00:02,10,2\n")
    error = _error(path)

    assert (error.path, error.line, error.field) == (str(path), 4, field)
    assert words in error.message
    assert str(error).startswith(f"{path}:4: {field}: ")


def test_the_first_of_several_bad_rows_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, AZURE_HEADER, "2023-11-16 18:00:00,10,2", "2023-11-16 18:00:01,0,2", "x,0,2")
    error = _error(path)
    # Rows are checked for width first, then column by column: the timestamp column fails before the tokens.
    assert (error.line, error.field) == (4, "TIMESTAMP")


@pytest.mark.parametrize(
    ("row", "field"),
    [("0,2,0,soon,1,1254,419", "arrival_timestamp"), ("0,2,0,inf,1,1254,419", "arrival_timestamp"),
     ("0,2,0,0.5,1,0,419", "prompt_size"), ("0,2,0,0.5,1,12,x", "token_size")],
)  # fmt: skip
def test_a_bad_splitwise_row_names_its_field(tmp_path: Path, row: str, field: str) -> None:
    error = _error(_write(tmp_path, SPLITWISE_HEADER, "1,2,0,0.25,1,454,40", row))
    assert (error.line, error.field) == (3, field)


def test_an_empty_file_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("")
    error = _error(path)
    assert (error.line, error.field) == (None, None)
    assert "empty file" in error.message


def test_a_header_without_rows_is_one_error(tmp_path: Path) -> None:
    error = _error(_write(tmp_path, AZURE_HEADER))
    assert error.line == 1
    assert "no requests" in error.message


@pytest.mark.parametrize(
    "header",
    ["TIMESTAMP,ContextTokens", "TIMESTAMP,ContextTokens,GeneratedTokens,Extra", "time,prompt,output"],
)
def test_a_wrong_header_names_both_known_formats(tmp_path: Path, header: str) -> None:
    error = _error(_write(tmp_path, header, "2023-11-16 18:00:00,10,2"))
    assert error.line == 1
    assert AZURE_HEADER in error.message
    assert SPLITWISE_HEADER in error.message


def test_a_missing_file_is_an_input_file_error(tmp_path: Path) -> None:
    error = _error(tmp_path / "absent.csv")
    assert "cannot read" in error.message


@pytest.mark.skipif(not SHARED_CONV.is_file(), reason="the shared Azure trace is not on this machine")
def test_the_azure_conversation_trace_reads_whole() -> None:
    trace = read_llm_trace(SHARED_CONV)
    assert len(trace) == 19_366
    assert np.all(np.diff(trace.arrival_s) >= 0)
    assert 3000 < trace.duration_s < 4000
    assert trace.prompt_tokens.min() >= 1
    assert trace.output_tokens.min() >= 1
