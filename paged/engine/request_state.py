"""The engine's record of one submitted request: its sequences, their text, and its output.

The scheduler sees sequences (a parallel-sampling request becomes n of them after its prompt);
the user sees one request. This record joins the two: it follows each sequence's new tokens,
detokenizes them incrementally, watches for stop strings (which only text can reveal, so the
engine ends those sequences itself), and assembles the `RequestOutput`.
"""
from __future__ import annotations

from paged import Request, RequestStatus, SamplingParams

from .request_output import CompletionOutput, RequestMetrics, RequestOutput
from .tokenizer import IncrementalDetokenizer, Tokenizer


class RequestState:
    __slots__ = ("request_id", "prompt", "params", "root", "seqs", "_tokenizer", "_detokenizers", "_num_read",
                 "_texts", "_stop_strings")

    def __init__(self, request_id: str, root: Request, prompt: str | None, tokenizer: Tokenizer | None) -> None:
        self.request_id = request_id  # the user's id (the scheduler's is root.request_id)
        self.prompt = prompt
        self.params: SamplingParams = root.sampling_params
        self.root = root
        self.seqs: list[Request] = []
        self._tokenizer = tokenizer
        self._detokenizers: list[IncrementalDetokenizer | None] = []
        self._num_read: list[int] = []
        self._texts: list[str] = []
        self._stop_strings: list[str | None] = []
        self.add_sequence(root)

    def add_sequence(self, seq: Request) -> None:
        tok = self._tokenizer
        self.seqs.append(seq)
        self._detokenizers.append(None if tok is None else IncrementalDetokenizer(tok, seq.prompt_token_ids))
        self._num_read.append(0)
        self._texts.append("")
        self._stop_strings.append(None)

    @property
    def finished(self) -> bool:
        return all(seq.is_finished for seq in self.seqs)

    def read_new_tokens(self) -> list[Request]:
        """Detokenize what each sequence produced since the last call; return the sequences that
        just completed a stop string (still running in the scheduler: the caller ends them)."""
        stopped = []
        stops = self.params.stop
        for i, seq in enumerate(self.seqs):
            new = seq.output_token_ids[self._num_read[i]:]
            detok = self._detokenizers[i]
            if not new or detok is None or self._stop_strings[i] is not None:
                continue
            self._num_read[i] += len(new)
            before = len(detok.text)
            detok.add(new)
            text = detok.text
            self._texts[i] = text
            if stops and self._num_read[i] >= self.params.min_tokens:  # (vLLM's rule for min_tokens)
                # A stop string may straddle the old and the new text, so search from just before the new part.
                start = max(0, before - max(map(len, stops)) + 1)
                hits = [(j, s) for s in stops if (j := text.find(s, start)) >= 0]
                if hits:
                    j, s = min(hits)
                    self._texts[i] = text[:j]
                    self._stop_strings[i] = s
                    if not seq.is_finished:
                        stopped.append(seq)
        return stopped

    def output(self) -> RequestOutput:
        outputs = [self._completion(i, seq) for i, seq in enumerate(self.seqs)]
        root = self.root
        done = [s.finished_time for s in self.seqs if s.finished_time is not None]
        metrics = RequestMetrics(
            arrival_time=root.arrival_time,
            first_scheduled_time=root.first_scheduled_time,
            first_token_time=root.first_token_time,
            finished_time=max(done) if self.finished and done else None,
            num_preemptions=sum(s.num_preemptions for s in self.seqs),
            num_cached_tokens=max(0, root.num_cached_tokens),
        )
        return RequestOutput(self.request_id, self.prompt, root.prompt_token_ids, outputs, self.finished, metrics)

    def _completion(self, i: int, seq: Request) -> CompletionOutput:
        reason = seq.finish_reason
        stop_reason = self._stop_strings[i]
        if stop_reason is not None:
            reason = "stop"
        elif seq.status == RequestStatus.FINISHED_STOPPED and seq.output_token_ids:
            stop_reason = seq.output_token_ids[-1]
        text = self._texts[i]
        stops = self.params.stop
        if stops and reason is None:
            # Hold back what could be the start of a stop string, as vLLM does: the text of a
            # running sequence is always a prefix of its final text, so a stream never has to
            # take back what it sent.
            text = text[:max(0, len(text) - max(map(len, stops)) + 1)]
        return CompletionOutput(seq.index, text, list(seq.output_token_ids), reason, stop_reason)
