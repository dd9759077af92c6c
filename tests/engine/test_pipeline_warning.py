"""The words of the lossy-exchange warning for the asynchronous pipeline's staleness bound."""
from lightning_fullgraph.engine import AsyncPipeline, ExchangePolicy


def test_max_async_epochs_zero_is_described_as_no_bound():
    # 0 means no bound (SYLVIE's setting), not "at most 0 async epochs".
    text = ExchangePolicy(pipeline=AsyncPipeline("async", max_async_epochs=0)).describe()
    assert "at most 0" not in text
    assert "no bound on the async epochs in a row: max_async_epochs=0" in text
    bounded = ExchangePolicy(pipeline=AsyncPipeline("async", max_async_epochs=3)).describe()
    assert "async pipeline (at most 3 async epochs in a row)" in bounded
