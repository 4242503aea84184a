from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parents[2] / "traces"


@pytest.fixture
def azure_conv() -> Path:
    return TRACES / "azure_llm_2023_conv.csv"


@pytest.fixture
def traces() -> Path:
    return TRACES
