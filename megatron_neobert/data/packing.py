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

``pack_documents`` is vectorised: in the coordinate where every document start costs 2 tokens,
samples advance by ``seq_length - 2`` until a sample ends exactly at a document end or on a gap;
numpy finds the next such event and only events run Python code (about 3 per ``mean document
length + 2`` samples on web text).
"""

from typing import NamedTuple

import numpy

PAD_PIECE = -1


class Layout(NamedTuple):
    sample_ptr: numpy.ndarray  # int64 [n_samples + 1]: pieces of sample i are ptr[i]:ptr[i+1]
    piece_doc: numpy.ndarray  # int64: position in the `lengths` given (PAD_PIECE for padding)
    piece_start: numpy.ndarray  # int64: first token of the piece within its document
    piece_len: numpy.ndarray  # int32: tokens taken (without [CLS]/[SEP])
    piece_wrapped: numpy.ndarray  # bool: piece re-reads the start of the order to fill the last
    #                              sample (it is not part of this epoch's single pass)


def _stream(order_lengths: numpy.ndarray, seq_length: int):
    """The epoch's documents followed by re-reads of its start (>= 2 samples' worth), so the
    last sample can be completed. Returns (position in the order per stream document, starts)."""
    n, total = order_lengths.shape[0], int(order_lengths.sum())
    if total >= 2 * seq_length:
        extra = int(numpy.searchsorted(numpy.cumsum(order_lengths), 2 * seq_length)) + 1
        pos = numpy.concatenate([numpy.arange(n), numpy.arange(min(extra, n))])
    else:
        pos = numpy.tile(numpy.arange(n), 1 + -(-2 * seq_length // total))
    starts = numpy.zeros(pos.shape[0] + 1, numpy.int64)
    numpy.cumsum(order_lengths[pos], out=starts[1:])
    return pos, starts


def pack_documents(lengths: numpy.ndarray, seq_length: int) -> Layout:
    """Pack documents, in the given order, into samples of exactly ``seq_length`` tokens.

    ``lengths[i]`` is the token count of the i-th document in epoch order (0 = skipped). The last
    sample is completed by wrapping around to the first documents again (marked ``wrapped``).
    """
    if seq_length < 8:
        raise ValueError(f"packed samples need seq_length >= 8, got {seq_length}")
    lengths = numpy.asarray(lengths, numpy.int64)
    order = numpy.flatnonzero(lengths > 0)
    if not order.size:
        raise ValueError("no non-empty document to pack")
    pos, starts = _stream(lengths[order], seq_length)
    end_of_epoch = int(starts[order.size])
    # h[d]: the coordinate of document d's start when each document start costs 2 ([CLS]/[SEP]).
    h = starts[:-1] + 2 * numpy.arange(pos.shape[0], dtype=numpy.int64)
    ends, splits, pads = [], [], []  # sample ends (token positions), in-sample splits, (sample, n)
    n_ends, start, target = 0, 0, seq_length  # target: the current sample's end coordinate
    window = 256
    while start < end_of_epoch:
        ys = target + (seq_length - 2) * numpy.arange(window, dtype=numpy.int64)
        d = numpy.searchsorted(h, ys, "right") - 1
        off = ys - h[d]
        bad = numpy.flatnonzero(off < 3)  # 0: ends on a document end; 1-2: a gap
        run = int(bad[0]) if bad.size else window
        cut = starts[d[:run]] + off[:run] - 2  # ends inside a document: plain cuts
        past = numpy.flatnonzero(cut >= end_of_epoch)
        if past.size:
            ends.append(cut[:past[0] + 1])
            break
        ends.append(cut)
        n_ends += run
        start = int(cut[-1]) if run else start
        if run == window:
            target = int(ys[-1]) + seq_length - 2
            window = min(2 * window, 1 << 16)
            continue
        window = max(64, 2 * run)
        dd, free = int(d[run]), int(off[run])
        end = (int(starts[dd]) if free == 0
               else _close_sample(starts, start, dd, free, splits, pads, n_ends))
        ends.append(numpy.array([end], numpy.int64))
        n_ends += 1
        start = end
        # The next sample starts on a document start (its [CLS] is already counted) or inside one.
        k = int(numpy.searchsorted(starts, end, "right")) - 1
        target = (int(h[k]) + seq_length if end == starts[k]
                  else end + 2 * k + seq_length)
    return _pieces(numpy.concatenate(ends), numpy.asarray(splits, numpy.int64), pads,
                   starts, order[pos], numpy.arange(pos.shape[0]) >= order.size)


def _close_sample(starts, first, d, free, splits, pads, sample):
    """A sample from token ``first`` whose document ``d - 1`` ends with ``free`` (1-2) tokens
    left: split pieces (after moving the last token, or a 1-token last piece, to the next
    sample when 1 is free), or pad. Returns where the sample ends."""
    lo = max(first, int(starts[d - 1]))  # the last piece (document d - 1) starts here
    whole = int(starts[d])
    bounds = numpy.concatenate([[first], starts[numpy.searchsorted(starts, first, "right"):d]])
    if free == 2:
        end, needed = whole, 1
    elif whole - lo >= 2:
        end, needed = whole - 1, 1
    else:  # a 1-token last piece moves to the next sample: 4 tokens to fill
        end, needed = lo, 2
    cuts = list(bounds[bounds < end]) + [end]
    made = []
    for _ in range(needed):
        sizes = numpy.diff(cuts)
        big = numpy.flatnonzero(sizes >= 2)
        if not big.size:
            break
        b = int(big[-1])
        made.append(int(cuts[b]) + int(sizes[b]) // 2)
        cuts.insert(b + 1, made[-1])
    if len(made) == needed:
        splits.extend(sorted(made))
        return end
    pads.append((sample, free))
    return whole


def _pieces(ends, splits, pads, starts, doc_of, wrapped_of) -> Layout:
    """Pieces between every document start, sample end and split, then the padding pieces."""
    last = int(ends[-1])
    used = starts[:numpy.searchsorted(starts, last)]  # document starts before the last end
    cuts = numpy.sort(numpy.concatenate([used, ends, splits]), kind="stable")  # merges 3 runs
    cuts = cuts[numpy.concatenate([[True], cuts[1:] != cuts[:-1]])]
    lo, hi = cuts[:-1], cuts[1:]
    del cuts, used
    sample = numpy.searchsorted(ends, lo, "right")
    doc = numpy.searchsorted(starts, lo, "right") - 1
    piece_doc, piece_start = doc_of[doc], lo - starts[doc]
    piece_len, piece_wrapped = (hi - lo).astype(numpy.int32), wrapped_of[doc]
    del doc, lo, hi
    if pads:
        pad_sample, pad_len = (numpy.asarray(x, numpy.int64) for x in zip(*pads))
        at = numpy.searchsorted(sample, pad_sample, "right")  # after the sample's last piece
        piece_doc = numpy.insert(piece_doc, at, PAD_PIECE)
        piece_start = numpy.insert(piece_start, at, 0)
        piece_len = numpy.insert(piece_len, at, pad_len.astype(numpy.int32))
        piece_wrapped = numpy.insert(piece_wrapped, at, False)
        sample = numpy.insert(sample, at, pad_sample)
    sample_ptr = numpy.zeros(ends.shape[0] + 1, numpy.int64)
    numpy.cumsum(numpy.bincount(sample, minlength=ends.shape[0]), out=sample_ptr[1:])
    return Layout(sample_ptr, piece_doc, piece_start, piece_len, piece_wrapped)


def piece_cost(piece_doc: numpy.ndarray, piece_len: numpy.ndarray) -> numpy.ndarray:
    """Tokens a piece occupies: its tokens plus [CLS] and [SEP]; a padding piece only its length."""
    return piece_len.astype(numpy.int64) + numpy.where(piece_doc == PAD_PIECE, 0, 2)


def chunk_documents(lengths: numpy.ndarray, seq_length: int) -> Layout:
    """One piece per sample: each document cut into chunks of ``seq_length - 2`` tokens."""
    if seq_length < 3:
        raise ValueError(f"seq_length must be >= 3, got {seq_length}")
    lengths = numpy.asarray(lengths, numpy.int64)
    room = seq_length - 2
    chunks = (lengths + room - 1) // room
    docs = numpy.repeat(numpy.arange(len(lengths), dtype=numpy.int64), chunks)
    first_chunk = numpy.repeat(numpy.cumsum(chunks) - chunks, chunks)
    starts = (numpy.arange(len(docs), dtype=numpy.int64) - first_chunk) * room
    lens = numpy.minimum(lengths[docs] - starts, room).astype(numpy.int32)
    return Layout(numpy.arange(len(docs) + 1, dtype=numpy.int64), docs, starts, lens,
                  numpy.zeros(len(docs), bool))
