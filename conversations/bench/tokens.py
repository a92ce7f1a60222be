"""Issue 13's per-token server CPU: `python manage.py bench_tokens`.

Where a streamed token's CPU goes in this process: litellm's stream handling alone (`llm.stream_call` reading an
arbor/echo answer, as every provider's answer is read), with litellm's per-chunk success logging on (litellm's
default: a thread-pool task for every chunk, for callbacks and caches Arbor does not use) and off (Arbor's
setting), and a whole turn on top (`detached.run_here`: the turn's events, its log, its node writes). Each is an
answer of `--words` words with no pause; CPU is `time.process_time()` (every thread of the process), divided by
the tokens. The three are measured interleaved, in rotated order, `--repeat` times; medians and spreads printed.
Nothing is asserted about time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import litellm
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.test.utils import override_settings

from conversations import llm, services
from conversations.turns import detached
from conversations.turns.start import turn_ask


def _drain(stream) -> int:
    count = 0
    try:
        while True:
            next(stream)
            count += 1
    except StopIteration:
        return count


class Command(BaseCommand):
    help = "Benchmark the server CPU a streamed token costs (issue 13)."

    def add_arguments(self, parser):
        parser.add_argument("--words", type=int, default=500, help="words per answer (default 500)")
        parser.add_argument("--repeat", type=int, default=7, help="interleaved rounds (default 7)")

    def handle(self, *args, **options):
        words, repeat = options["words"], options["repeat"]
        question = "#slow " + " ".join(f"w{i}" for i in range(words))
        owner, _ = get_user_model().objects.get_or_create(username="arbor-bench-tokens")
        conversation = services.conversation_create(owner=owner, title="arbor-bench-tokens")

        def stream_call(logging_on: bool) -> Callable[[], int]:
            def run() -> int:
                before, litellm.disable_streaming_logging = litellm.disable_streaming_logging, not logging_on
                try:
                    return _drain(llm.stream_call(model="arbor/echo", messages=[{"role": "user", "content": question}]))
                finally:
                    litellm.disable_streaming_logging = before
            return run

        def whole_turn() -> int:
            events = detached.run_here(turn_ask(user=owner, conversation_id=conversation.pk, content=question))
            services.head_move(conversation=conversation.__class__.objects.get(pk=conversation.pk), to=None)
            return sum(1 for e in events if e.type == "token")

        cases = {"litellm stream handling, its per-chunk logging on (litellm's default)": stream_call(True),
                 "litellm stream handling, its per-chunk logging off (Arbor's setting)": stream_call(False),
                 "a whole turn (events, log, node writes) on top, logging off": whole_turn}
        samples: dict[str, list[float]] = {name: [] for name in cases}
        names = list(cases)
        with override_settings(ARBOR_ECHO_WORD_SECONDS=0, ARBOR_ECHO_MAX_INPUT_TOKENS=10**9):
            for name in names:  # warm up each once
                cases[name]()
            for round_number in range(repeat):
                shift = round_number % len(names)
                for name in names[shift:] + names[:shift]:
                    began = time.process_time()
                    tokens = cases[name]()
                    samples[name].append((time.process_time() - began) / max(tokens, 1) * 1e6)
        services.conversation_delete(conversation=conversation)
        self.stdout.write(f"== server CPU per streamed token (arbor/echo, {words}-word answers, {repeat} rounds, "
                          "interleaved and rotated; process CPU of every thread / tokens)")
        for name in names:
            values = samples[name]
            self.stdout.write(f"{statistics.median(values):8.1f} µs  (min {min(values):.1f}, max {max(values):.1f})  "
                              f"{name}")
