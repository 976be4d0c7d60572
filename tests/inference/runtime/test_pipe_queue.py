"""StreamPipe hand-off between threads, and the bounded JobQueue."""

import asyncio
import threading

import pytest

from inference.runtime.pipe import StreamPipe
from inference.runtime.queue import Job, JobQueue, QueueClosed, QueueFull
from inference.types import Error, Finish, GenerationRequest, Message, PreparedPrompt, TextDelta, Usage

FINISH = Finish("stop", Usage(3, 2))


async def collect(pipe: StreamPipe) -> list:
    events = []
    while (event := await pipe.get()) is not None:
        events.append(event)
    return events


def test_events_pushed_from_another_thread_arrive_in_order():
    async def scenario():
        pipe = StreamPipe(asyncio.get_running_loop())

        def producer():
            for i in range(200):
                pipe.push(TextDelta(str(i % 10)))
            pipe.close(FINISH)

        thread = threading.Thread(target=producer)
        thread.start()
        events = await asyncio.wait_for(collect(pipe), 5)
        thread.join()
        return events

    events = asyncio.run(scenario())
    assert events[-1] == FINISH
    assert "".join(e.text for e in events[:-1]) == "".join(str(i % 10) for i in range(200))


def test_buffered_text_deltas_merge_and_nothing_follows_the_terminal_event():
    async def scenario():
        pipe = StreamPipe(asyncio.get_running_loop())
        for text in ("a", "b", "c"):
            pipe.push(TextDelta(text))
        pipe.close(FINISH)
        pipe.push(TextDelta("late"))
        return await collect(pipe)

    assert asyncio.run(scenario()) == [TextDelta("abc"), FINISH]


def test_abort_delivers_the_error_and_marks_cancelled():
    async def scenario():
        pipe = StreamPipe(asyncio.get_running_loop())
        pipe.push(TextDelta("x"))
        pipe.abort(Error(503, "bye"))
        pipe.close(FINISH)  # the worker's late finish is dropped
        return pipe.cancelled, await collect(pipe)

    cancelled, events = asyncio.run(scenario())
    assert cancelled
    assert events == [TextDelta("x"), Error(503, "bye")]


@pytest.fixture
def make_job():
    loop = asyncio.new_event_loop()
    request = GenerationRequest((Message("user", "hi"),))
    yield lambda: Job(request, PreparedPrompt([1, 2], 4), StreamPipe(loop))
    loop.close()


def test_queue_is_bounded_and_takes_what_is_already_queued(make_job):
    queue = JobQueue(2)
    a, b, c = make_job(), make_job(), make_job()
    queue.submit(a)
    queue.submit(b)
    with pytest.raises(QueueFull):
        queue.submit(c)
    assert queue.take(max_jobs=5) == [a, b]
    assert queue.take(max_jobs=1, timeout=0.01) == []


def test_queue_cancel_and_close(make_job):
    queue = JobQueue(3)
    a, b = make_job(), make_job()
    queue.submit(a)
    queue.submit(b)
    assert queue.cancel(a) and not queue.cancel(a)
    assert queue.close() == [b]
    with pytest.raises(QueueClosed):
        queue.submit(make_job())
    assert queue.take() == []


def test_take_blocks_until_a_job_arrives(make_job):
    queue = JobQueue(1)
    job = make_job()
    timer = threading.Timer(0.05, queue.submit, args=(job,))
    timer.start()
    assert queue.take(timeout=5) == [job]
