"""Layout 3's packer (megatron_neobert/data/datasets/packing.py until the per-sample layout), kept as the oracle of the
tests: vectorised, it materialises every piece of every sample, fast enough to compare the per-sample layout with at
scale. Its rules are those of packing.py's docstring; ``packing_reference.py`` is the slow sequential reference.
"""

from typing import NamedTuple

import numpy

PAD_PIECE = -1


class Layout(NamedTuple):
    sample_ptr: numpy.ndarray  # int64 [n_samples + 1]: pieces of sample i are ptr[i]:ptr[i+1]
    piece_doc: numpy.ndarray  # int32 (int64 from 2**31 documents): position in the `lengths` given (PAD_PIECE: padding)
    piece_start: numpy.ndarray  # int64: first token of the piece within its document
    piece_len: numpy.ndarray  # int32: tokens taken (without [CLS]/[SEP])
    piece_wrapped: numpy.ndarray  # bool: piece re-reads the start of the order to fill the last
    #                              sample (it is not part of this epoch's single pass)


def _stream(lengths: numpy.ndarray, order: numpy.ndarray, seq_length: int):
    """The epoch's documents followed by re-reads of its start (>= 2 samples' worth), so the
    last sample can be completed. Returns (document id per stream position, starts)."""
    total = int(lengths[order].sum(dtype=numpy.int64))
    if total >= 2 * seq_length:
        extra = int(numpy.searchsorted(numpy.cumsum(lengths[order[:2 * seq_length]]),
                                       2 * seq_length)) + 1
        doc_of = numpy.concatenate([order, order[:extra]])
    else:
        doc_of = numpy.tile(order, 1 + -(-2 * seq_length // total))
    starts = numpy.zeros(doc_of.shape[0] + 1, numpy.int64)
    # (dtype given: an int32 input summed into int64 without it takes the slow casting path, 10x)
    numpy.cumsum(lengths[doc_of], out=starts[1:], dtype=numpy.int64)
    return doc_of, starts


def pack_documents(lengths: numpy.ndarray, seq_length: int) -> Layout:
    """Pack documents, in the given order, into samples of exactly ``seq_length`` tokens.

    ``lengths[i]`` is the token count of the i-th document in epoch order (0 = skipped). The last
    sample is completed by wrapping around to the first documents again (marked ``wrapped``).
    """
    if seq_length < 8:
        raise ValueError(f"packed samples need seq_length >= 8, got {seq_length}")
    lengths = numpy.asarray(lengths)  # int32 is enough: positions are summed in int64
    order = numpy.flatnonzero(lengths > 0)
    if order.size and order[-1] < 2**31:  # int32 document positions: half the memory of the pieces' documents
        order = order.astype(numpy.int32)
    if not order.size:
        raise ValueError("no non-empty document to pack")
    doc_of, starts = _stream(lengths, order, seq_length)
    n_own = order.size
    end_of_epoch = int(starts[n_own])
    del lengths, order  # the stream holds what is needed of them: peak memory
    # h[d]: the coordinate of document d's start when each document start costs 2 ([CLS]/[SEP]).
    h = numpy.arange(doc_of.shape[0], dtype=numpy.int64)
    h *= 2
    h += starts[:-1]
    ends, end_docs = [], []  # where samples end (token positions) and the document holding it
    splits, pads = [], []  # in-sample splits (token positions), (sample, tokens) paddings
    n_ends, start, target = 0, 0, seq_length  # target: the current sample's end coordinate
    window, steps = 256, (seq_length - 2) * numpy.arange(1 << 16, dtype=numpy.int64)
    while start < end_of_epoch:
        ys = target + steps[:window]
        d = numpy.searchsorted(h, ys, "right") - 1
        off = ys - h[d]
        bad = numpy.flatnonzero(off < 3)  # 0: ends on a document end; 1-2: a gap
        run = int(bad[0]) if bad.size else window
        cut = starts[d[:run]] + off[:run] - 2  # ends inside a document: plain cuts
        if run and cut[-1] >= end_of_epoch:
            last = int(numpy.searchsorted(cut, end_of_epoch)) + 1
            ends.append(cut[:last])
            end_docs.append(d[:last])
            break
        ends.append(cut)
        end_docs.append(d[:run])
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
        k = int(numpy.searchsorted(starts, end, "right")) - 1
        ends.append(numpy.array([end], numpy.int64))
        end_docs.append(numpy.array([k], numpy.int64))
        n_ends += 1
        start = end
        # The next sample starts on a document start (its [CLS] is already counted) or inside one.
        target = int(h[k]) + seq_length if end == starts[k] else end + 2 * k + seq_length
    del h
    ends, end_docs = numpy.concatenate(ends), numpy.concatenate(end_docs)
    return _pieces(ends, end_docs, numpy.asarray(splits, numpy.int64), pads, starts, doc_of, n_own)


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
    # A sample holds a few pieces: plain Python lists beat numpy calls here (this runs once per event).
    cuts = [c for c in bounds.tolist() if c < end] + [end]
    made = []
    for _ in range(needed):
        sizes = [b - a for a, b in zip(cuts, cuts[1:])]
        big = [i for i, size in enumerate(sizes) if size >= 2]
        if not big:
            break
        b = big[-1]
        made.append(cuts[b] + sizes[b] // 2)
        cuts.insert(b + 1, made[-1])
    if len(made) == needed:
        splits.extend(sorted(made))
        return end
    pads.append((sample, free))
    return whole


def _pieces(ends, end_docs, splits, pads, starts, doc_of, n_own) -> Layout:
    """Every document up to the last sample end, cut at the sample ends and splits inside it,
    then the padding pieces after their sample's last piece. No sort, no search over pieces:
    the cuts arrive sorted with their documents."""
    last = int(ends[-1])
    aligned = ends == starts[end_docs]  # the sample ends on a document end
    n_docs = int(end_docs[-1]) + (0 if aligned[-1] else 1)
    inner_end = ~aligned
    inner_end[-1] = False  # the last end closes the layout, it opens no piece
    ends_in, docs_in = ends[inner_end], end_docs[inner_end]
    n_samples = ends.shape[0]
    del ends, inner_end  # peak memory
    split_docs = numpy.searchsorted(starts, splits, "right") - 1
    # Merge two sorted runs: an element's place is its rank plus the other run's elements before.
    at_end = numpy.arange(ends_in.shape[0]) + numpy.searchsorted(splits, ends_in)
    at_split = numpy.arange(splits.shape[0]) + numpy.searchsorted(ends_in, splits)
    n_inner = ends_in.shape[0] + splits.shape[0]
    inner, inner_doc, inner_is_end = (numpy.empty(n_inner, numpy.int64),
                                      numpy.empty(n_inner, numpy.int64), numpy.zeros(n_inner, bool))
    inner[at_end], inner[at_split] = ends_in, splits
    inner_doc[at_end], inner_doc[at_split] = docs_in, split_docs
    inner_is_end[at_end] = True
    del ends_in, docs_in, at_end, at_split
    per_doc = numpy.bincount(inner_doc, minlength=n_docs) + 1
    del inner_doc
    first = numpy.zeros(n_docs, numpy.int64)  # each document's first piece
    numpy.cumsum(per_doc[:-1], out=first[1:])
    opens_doc = numpy.zeros(n_docs + n_inner, bool)
    opens_doc[first] = True
    lo = numpy.empty(n_docs + n_inner, numpy.int64)
    lo[first] = starts[:n_docs]
    lo[~opens_doc] = inner
    opens_sample = numpy.zeros(n_docs + n_inner, bool)
    opens_sample[~opens_doc] = inner_is_end
    opens_sample[first[end_docs[aligned][:-1 if aligned[-1] else None]]] = True
    del inner, inner_is_end, opens_doc, first, end_docs, aligned
    sample_ptr = numpy.concatenate([[0], numpy.flatnonzero(opens_sample), [n_docs + n_inner]])
    del opens_sample
    piece_len = numpy.empty(lo.shape[0], numpy.int32)
    numpy.subtract(lo[1:], lo[:-1], out=piece_len[:-1], casting="unsafe")
    piece_len[-1] = last - lo[-1]
    index = numpy.int32 if n_docs < 2**31 else numpy.int64
    doc = numpy.repeat(numpy.arange(n_docs, dtype=index), per_doc)
    del per_doc
    piece_doc = numpy.empty(doc.shape[0], doc_of.dtype)
    for at in range(0, doc.shape[0], 1 << 22):  # in slices: no temporary as large as the pieces
        piece = doc[at:at + (1 << 22)]
        piece_doc[at:at + piece.shape[0]] = doc_of[piece]
        lo[at:at + piece.shape[0]] -= starts[piece]
    piece_start, piece_wrapped = lo, doc >= n_own
    del doc
    if pads:
        pad_sample, pad_len = (numpy.asarray(x, numpy.int64) for x in zip(*pads))
        at = sample_ptr[pad_sample + 1]  # after the sample's last piece
        piece_doc = numpy.insert(piece_doc, at, PAD_PIECE)
        piece_start = numpy.insert(piece_start, at, 0)
        piece_len = numpy.insert(piece_len, at, pad_len.astype(numpy.int32))
        piece_wrapped = numpy.insert(piece_wrapped, at, False)
        sample_ptr[1:] += numpy.cumsum(numpy.bincount(pad_sample, minlength=n_samples))
    return Layout(sample_ptr, piece_doc, piece_start, piece_len, piece_wrapped)
