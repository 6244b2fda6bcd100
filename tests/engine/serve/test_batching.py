"""The built-in engine on the tiny model: greedy replies the same alone and in a batch of sixteen, stop strings,
a full queue refused at once, a reader that leaves freeing its place."""

import asyncio

import pytest

from dragon_dagster.engine.serve.batching import BatchingEngine, BatchingOptions
from dragon_dagster.engine.serve.engine import EngineBusy, PromptTooLong, Sampling


@pytest.fixture(scope="module")
def engine(chatty_model):
    found = BatchingEngine(chatty_model, "chatty/1", BatchingOptions(max_batch=16, max_queue=0, cache_tokens=8192))
    yield found
    found.close()


def ask(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Question number {i}: what is {i} plus {i}?"}]


async def reply(engine, messages, sampling) -> tuple[str, str, int]:
    text, last = "", None
    async for chunk in engine.stream(messages, None, sampling):
        text, last = text + chunk.text, chunk
    return text, last.finish_reason, last.completion_tokens


def test_greedy_replies_are_the_same_alone_and_in_a_batch_of_sixteen(engine):
    greedy = Sampling(max_tokens=12, temperature=0)

    async def run():
        alone = [await reply(engine, ask(i), greedy) for i in range(16)]
        together = await asyncio.gather(*(reply(engine, ask(i), greedy) for i in range(16)))
        return alone, together

    alone, together = asyncio.run(run())
    assert together == alone
    assert len({text for text, _, _ in alone}) > 1, "distinct prompts, distinct replies: the rows were not mixed up"
    assert all(reason == "length" and tokens == 12 for _, reason, tokens in alone)


def test_a_stop_string_ends_the_reply_before_it(engine):
    greedy = Sampling(max_tokens=12, temperature=0)
    full, _, _ = asyncio.run(reply(engine, ask(3), greedy))
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip(), full
    cut, reason, _ = asyncio.run(reply(engine, ask(3), Sampling(max_tokens=12, temperature=0, stop=(stop,))))
    assert cut == full[: full.index(stop)] and reason == "stop"


def test_a_full_engine_refuses_at_once_and_a_reader_that_leaves_frees_its_place(tiny_model):
    async def run(engine):
        long = Sampling(max_tokens=200, temperature=0)
        first = engine.stream(ask(1), None, long)
        await anext(first)  # decoding: the one place (max_batch 1, max_queue 0) is taken
        with pytest.raises(EngineBusy):
            await anext(engine.stream(ask(2), None, long))
        await first.aclose()  # the reader leaves: its request is cancelled and its place freed
        assert engine.in_flight() == 0
        return await reply(engine, ask(2), Sampling(max_tokens=4, temperature=0))

    engine = BatchingEngine(tiny_model, "tiny/1", BatchingOptions(max_batch=1, max_queue=0, cache_tokens=4096))
    try:
        _, reason, tokens = asyncio.run(run(engine))
    finally:
        engine.close()
    assert tokens == 4 and reason == "length"


def test_a_prompt_over_the_context_is_refused_before_decoding(engine):
    words = [{"role": "user", "content": "word " * 2000}]
    with pytest.raises(PromptTooLong) as refused:
        asyncio.run(reply(engine, words, Sampling(max_tokens=8, temperature=0)))
    assert "context of 1024 tokens" in str(refused.value)
