"""Lay documents out into MLM samples: packed (default) or one document chunk per padded sample.

A sample is a list of *pieces* ``(doc, start, length)``; each piece becomes
``[CLS] tokens[start:start+length] [SEP]`` and is its own attention segment (cu_seqlens), so
packing never lets two documents attend to each other (the NeoBERT paper's -2.8% GLUE came from
packing *without* that). A document longer than the room left is cut: the rest starts the next
sample as a new piece, so no token is thrown away.

Packed samples hold exactly ``seq_length`` tokens, filled greedily in epoch order. A piece costs
``length + 2``, so a sample must never end with 1 or 2 free tokens. Where a whole document would
leave such a gap:

- 2 free: the last piece of the sample with >= 2 tokens is split in two at its middle (the
  extra [CLS]/[SEP] fill the gap);
- 1 free: the document is cut one token before its end (that token starts the next sample) and a
  piece is split as above; a 1-token document instead moves whole to the next sample and two
  splits fill the 4 free tokens.

Only a sample whose pieces cannot be split that way (1-token pieces, at most one of 2: a corpus
of 1-2 token documents) gets a ``[PAD]`` piece (doc = -1, no [CLS]/[SEP]) without labels.

A sample's pieces depend only on where it starts and on the lengths of the documents it reaches, so the layout
keeps two integers per sample, as megatron-core's sample index does: the *stream position* of its first document
(its place in the epoch order; positions past the order re-read its start, to complete the last sample) and the
token offset in it. The pieces are derived when a sample is read (``packed_pieces``, ``chunk_piece``).

``pack_starts`` finds the starts by the sequential walk itself, in C (``packing.c``, compiled at first use:
``native.py``), one pass over the documents as megatron-core's C++ ``build_sample_idx`` makes its sample index.
Without a C compiler it finds the same starts vectorised in numpy. In the coordinate ``h`` where every document start costs 2 tokens
([CLS]/[SEP]), sample ends advance by ``seq_length - 2`` until one lands 0-2 past a document's start (it ends on
a document end, or leaves a 1-2 token gap: an *event*, about one sample in 200 on web text). Such a document is
found among the next ones by its ``h`` modulo ``seq_length - 2``, so only events run Python code; the other
samples' documents come from one search of their ends at the end.
"""

from typing import Callable, List, NamedTuple, Optional

import numpy

from megatron_neobert.data.datasets import native

PAD_PIECE = -1
_CHUNK = 1 << 20  # elements per slice of the passes over documents and samples: temporaries of a few MB


class SampleStarts(NamedTuple):
    position: numpy.ndarray  # int32 (int64 past 2**31 positions): stream position of the first document
    offset: numpy.ndarray  # int32: tokens of that document in the samples before


def _position_dtype(n: int):
    return numpy.int32 if n < 2**31 else numpy.int64


def _document_starts(lengths: numpy.ndarray, seq_length: int) -> numpy.ndarray:
    """``h`` of the stream: the epoch's documents, then re-reads of its start (>= 2 samples' worth) so that the last
    sample can be completed; one more entry after the last."""
    n = lengths.shape[0]
    total = int(lengths.sum(dtype=numpy.int64))
    if total >= 2 * seq_length:
        stream = n + int(numpy.searchsorted(numpy.cumsum(lengths[:2 * seq_length]), 2 * seq_length)) + 1
    else:  # a corpus shorter than two samples: the order repeated
        stream = n * (1 + -(-2 * seq_length // total))
    h = numpy.empty(stream + 1, numpy.int64)
    h[0], carry = 0, 0
    for lo in range(0, stream, _CHUNK):
        hi = min(stream, lo + _CHUNK)
        part = lengths[numpy.arange(lo, hi) % n] if hi > n else lengths[lo:hi]
        numpy.cumsum(part + 2, out=h[lo + 1:hi + 1], dtype=numpy.int64)
        h[lo + 1:hi + 1] += carry
        carry = int(h[hi])
    return h


def _residues(h: numpy.ndarray, period: int) -> numpy.ndarray:
    """h modulo period (float division: a fifth of integer division's time; h < 2**53 keeps it exact but for the
    rounding at multiples, corrected)."""
    r = numpy.empty(h.shape[0], numpy.int16 if period < 2**14 else numpy.int32)
    for lo in range(0, h.shape[0], _CHUNK):
        part = h[lo:lo + _CHUNK]
        q = numpy.floor(part * (1.0 / period))
        rest = part - (q * period).astype(numpy.int64)
        rest[rest < 0] += period
        rest[rest >= period] -= period
        r[lo:lo + part.shape[0]] = rest
    return r


def pack_starts(lengths: numpy.ndarray, seq_length: int, order: Optional[numpy.ndarray] = None,
                tokens: Optional[int] = None) -> SampleStarts:
    """Where each packed sample of exactly ``seq_length`` tokens starts, for the documents ``lengths[order]`` (or
    ``lengths``; each > 0) in epoch order, of ``tokens`` tokens in all when the caller knows it. Samples start while
    the epoch's own tokens last; the last one is completed by re-reading the order's start (stream positions ``>= n``
    are documents ``position % n``)."""
    if seq_length < 8:
        raise ValueError(f"packed samples need seq_length >= 8, got {seq_length}")
    lengths = numpy.asarray(lengths)
    if not (lengths if order is None else order).size:
        raise ValueError("no non-empty document to pack")
    lib = native.library()
    if lib is None:
        return _vectorised_starts(lengths if order is None else lengths[order], seq_length)
    return _walked_starts(lib, lengths, order, seq_length, tokens)


def _walked_starts(lib, lengths, order, seq_length, tokens) -> SampleStarts:
    lengths = numpy.ascontiguousarray(lengths, numpy.int32)
    if order is not None:
        order = numpy.ascontiguousarray(order, numpy.int32 if order.dtype == numpy.int32 else numpy.int64)
    n = (lengths if order is None else order).shape[0]
    if tokens is None:
        tokens = int((lengths if order is None else lengths[order]).sum(dtype=numpy.int64))
    # A sample either moves on to a later document, which n samples at most do, or cuts >= seq_length - 4 tokens
    # off the one it starts in. The arrays are allocated for that bound but only the pages written become memory:
    # the samples' starts are views of them.
    capacity = n + tokens // (seq_length - 4) + 1
    position, offset = numpy.empty(capacity, _position_dtype(n)), numpy.empty(capacity, numpy.int32)
    order_dtype = numpy.dtype(numpy.int32 if order is None else order.dtype)
    walk = getattr(lib, f"pack_starts_{position.dtype.name}_{order_dtype.name}")
    samples = walk(lengths, None if order is None else order.ctypes.data, n, seq_length, position, offset, capacity)
    if samples < 0:
        raise RuntimeError(f"more packed samples than the bound of {capacity:,} for {n:,} documents")
    return SampleStarts(position[:samples], offset[:samples])


def _vectorised_starts(lengths: numpy.ndarray, seq_length: int) -> SampleStarts:
    """``pack_starts`` in numpy: events (a sample that ends 0-2 tokens past a document's start) found from the
    documents' ``h`` modulo ``seq_length - 2``, the other samples' documents by one search of their ends."""
    n, period = lengths.shape[0], seq_length - 2
    h = _document_starts(lengths, seq_length)
    r = _residues(h[:-1], period)
    last_plain = int(h[n]) + 3  # a plain end at or past it lies in a re-read document: the epoch's last sample
    segments, events = [], []  # (first end coordinate, samples) per run of samples; (position, offset) per event
    target, first, first_doc, window = seq_length, 0, 0, 512
    while True:
        # Plain ends are target + period * m; the epoch's last is the first at or past last_plain.
        m_last = max(0, -(-(last_plain - target) // period))
        y_last, phase = target + period * m_last, target % period
        d, event = int(numpy.searchsorted(h, target - 2)), None
        while event is None and d < r.shape[0] and int(h[d]) <= y_last:
            w = r[d:d + window]  # an event document: (target - h) % period in {0, 1, 2}
            hits = (w <= phase) & (w >= phase - 2) if phase >= 2 else (w <= phase) | (w >= phase - 2 + period)
            at = int(hits.argmax())  # (the first True: argmax stops there)
            if hits[at]:
                event, window = d + at, max(512, 2 * at)
            else:
                d, window = d + window, min(2 * window, 1 << 16)
        free = None if event is None else (phase - int(r[event])) % period
        if event is None or int(h[event]) + free > y_last:
            segments.append((target, m_last + 1))
            break
        m = (int(h[event]) + free - target) // period
        if m:  # the event sample starts where the plain one before it ends
            first_doc = int(numpy.searchsorted(h, target + period * (m - 1), "right")) - 1
            first = target + period * (m - 1) - 2 * first_doc - 2
        end = int(h[event]) - 2 * event if free == 0 else _close_sample(h, first, first_doc, event, free)
        k = event if end == int(h[event]) - 2 * event else event - 1  # the document the next sample starts in
        segments.append((target, m + 1))
        events.append((k, end - (int(h[k]) - 2 * k)))
        if end >= int(h[n]) - 2 * n:
            break
        first, first_doc = end, k
        target = (int(h[k]) if end == int(h[k]) - 2 * k else end + 2 * k) + seq_length
    del r  # peak memory
    return _starts(h, segments, events, period)


def _close_sample(h, first, first_doc, d, free):
    """Where a sample from token ``first`` (in document ``first_doc``) ends when document ``d - 1`` ends with
    ``free`` (1-2) tokens left: after moving the last token, or a 1-token last piece, to the next sample when 1 is
    free, if its pieces can be split ``needed`` times (a split takes a piece of >= 2 tokens: possible while the
    tokens exceed the pieces by ``needed``); else the sample is padded and ends with the document."""
    whole, last = int(h[d]) - 2 * d, int(h[d - 1]) - 2 * (d - 1)
    lo = max(first, last)  # the last piece (document d - 1) starts here
    if free == 2:
        end, needed, pieces = whole, 1, d - first_doc
    elif whole - lo >= 2:
        end, needed, pieces = whole - 1, 1, d - first_doc
    else:  # a 1-token last piece moves to the next sample: 4 tokens to fill
        end, needed, pieces = lo, 2, d - 1 - first_doc
    return end if end - first - pieces >= needed else whole


def _starts(h, segments, events, period) -> SampleStarts:
    """Sample i + 1 starts where sample i ends: a plain end's document found by one search over ``h`` a slice at
    a time, an event's given."""
    counts = numpy.array([c for _, c in segments], numpy.int64)
    n_samples = int(counts.sum())
    seg_first = numpy.zeros(counts.shape[0] + 1, numpy.int64)
    numpy.cumsum(counts, out=seg_first[1:])
    base = numpy.array([t for t, _ in segments], numpy.int64) - period * seg_first[:-1]
    position = numpy.zeros(n_samples, _position_dtype(h.shape[0]))
    offset = numpy.zeros(n_samples, numpy.int32)
    for lo in range(0, n_samples, _CHUNK):  # a million samples at a time: four temporaries of 8 bytes each
        hi = min(n_samples, lo + _CHUNK)
        s0, s1 = int(numpy.searchsorted(seg_first, lo, "right")) - 1, int(numpy.searchsorted(seg_first, hi))
        in_slice = numpy.diff(numpy.clip(seg_first[s0:s1 + 1], lo, hi))  # each segment's samples in the slice
        ends = numpy.repeat(base[s0:s1], in_slice) + period * numpy.arange(lo, hi, dtype=numpy.int64)
        # Searched among the documents the slice spans: a part of h that stays in the CPU's caches.
        first, last = numpy.searchsorted(h, [ends[0], ends[-1]], "right") - 1
        doc = numpy.searchsorted(h[first:last + 1], ends, "right") + (first - 1)
        ends -= h[doc]
        ends -= 2  # tokens of the document before the end
        hi = min(hi, n_samples - 1)  # the last sample's end starts nothing
        position[lo + 1:hi + 1], offset[lo + 1:hi + 1] = doc[:hi - lo], ends[:hi - lo]
    events = events[:counts.shape[0] - 1]  # the last sample's end starts nothing
    if events:
        at = seg_first[1:len(events) + 1]  # an event ends its segment; its end starts the next one's first sample
        position[at], offset[at] = zip(*events)
    return SampleStarts(position, offset)


def chunk_starts(lengths: numpy.ndarray, seq_length: int) -> SampleStarts:
    """One sample per chunk of ``seq_length - 2`` tokens of each document (each > 0), in order."""
    if seq_length < 3:
        raise ValueError(f"seq_length must be >= 3, got {seq_length}")
    lengths = numpy.asarray(lengths, numpy.int64)
    room = seq_length - 2
    chunks = (lengths + room - 1) // room
    position = numpy.repeat(numpy.arange(lengths.shape[0], dtype=_position_dtype(lengths.shape[0])), chunks)
    first_chunk = numpy.repeat(numpy.cumsum(chunks) - chunks, chunks)
    return SampleStarts(position, ((numpy.arange(position.shape[0]) - first_chunk) * room).astype(numpy.int32))


def chunk_piece(position: int, offset: int, seq_length: int, length: int) -> List[List[int]]:
    """The one piece of a padded sample, of a document of ``length`` tokens."""
    return [[position, offset, min(length - offset, seq_length - 2)]]


def packed_pieces(position: int, offset: int, seq_length: int,
                  lengths_at: Callable[[int, int], List[int]]) -> List[List[int]]:
    """The pieces ``[stream position, start, length]`` (padding: ``[PAD_PIECE, 0, length]``) of the packed sample
    that starts ``offset`` tokens into the document at ``position``. ``lengths_at(lo, hi)``: the lengths of the
    documents at stream positions lo..hi-1, asked for a few at a time."""
    pieces, room, j, off = [], seq_length, position, offset
    ahead, known = [], position
    while room:
        if j == known:
            ahead = lengths_at(j, j + max(4, 2 * len(ahead)))
            known = j + len(ahead)
        rest = ahead[j - known + len(ahead)] - off
        free = room - rest - 2
        if free == 0 or free >= 3:  # the document fits whole
            pieces.append([j, off, rest])
            room, j, off = free, j + 1, 0
        elif free < 0:  # cut: the rest opens the next sample
            pieces.append([j, off, room - 2])
            room = 0
        else:  # a 1-2 token gap
            def can_split():
                return any(p[2] >= 2 for p in pieces)
            if free == 1 and rest >= 2 and (rest >= 3 or can_split()):
                pieces.append([j, off, rest - 1])  # the last token opens the next sample
                _split_last_big(pieces)
            elif free == 1 and rest == 1 and sum(p[2] - 1 for p in pieces) >= 2:
                _split_last_big(pieces)  # the 1-token document opens the next sample
                _split_last_big(pieces)
            else:
                pieces.append([j, off, rest])
                if free == 2 and can_split():
                    _split_last_big(pieces)
                else:
                    pieces.append([PAD_PIECE, 0, free])
            room = 0
    return pieces


def _split_last_big(pieces):
    k = max(i for i, p in enumerate(pieces) if p[2] >= 2)
    j, start, length = pieces[k]
    pieces[k:k + 1] = [[j, start, length // 2], [j, start + length // 2, length - length // 2]]
