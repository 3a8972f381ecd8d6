"""Lay documents out into MLM samples: packed (default) or one document chunk per padded sample.

A sample is a list of *pieces* ``(doc, start, length)``; each piece becomes
``[CLS] tokens[start:start+length] [SEP]`` and is its own attention segment (cu_seqlens), so
packing never lets two documents attend to each other (the NeoBERT paper's -2.8% GLUE came from
packing *without* that). A document longer than the room left is cut: the rest starts the next
sample as a new piece, so no token is thrown away.

Packed samples hold exactly ``seq_length`` tokens. A piece costs ``length + 2``, so the room left
in a sample must never be 1 or 2; the packer shortens a piece (the cut part moves on) or, when the
document is too short to shorten, lets the next document that can fill the room go first. Only
in a corpus made of 1-2 token documents may it find none; then the room is filled with one
``[PAD]`` piece (doc = -1, no [CLS]/[SEP]) that carries no label.
"""

from typing import NamedTuple

import numpy

PAD_PIECE = -1
_LOOKAHEAD = 4096  # documents searched for one that can fill a 3-5 token gap


class Layout(NamedTuple):
    sample_ptr: numpy.ndarray  # int64 [n_samples + 1]: pieces of sample i are ptr[i]:ptr[i+1]
    piece_doc: numpy.ndarray  # int64: position in the `lengths` given (PAD_PIECE for padding)
    piece_start: numpy.ndarray  # int64: first token of the piece within its document
    piece_len: numpy.ndarray  # int32: tokens taken (without [CLS]/[SEP])
    piece_wrapped: numpy.ndarray  # bool: piece re-reads the start of the order to fill the last
    #                              sample (it is not part of this epoch's single pass)


def pack_documents(lengths: numpy.ndarray, seq_length: int) -> Layout:
    """Pack documents, in the given order, into samples of exactly ``seq_length`` tokens.

    ``lengths[i]`` is the token count of the i-th document in epoch order (0 = skipped). The last
    sample is completed by wrapping around to the first documents again (marked ``wrapped``).
    """
    if seq_length < 8:
        raise ValueError(f"packed samples need seq_length >= 8, got {seq_length}")
    lengths = [int(x) for x in lengths]
    order = [i for i, n in enumerate(lengths) if n > 0]
    if not order:
        raise ValueError("no non-empty document to pack")
    n = len(order)
    ptr, docs, starts, lens, wrapped = [0], [], [], [], []
    pos = 0  # next position in `order`; >= n means wrapping around
    pending = []  # (doc, offset, wrapped) set aside so a longer document could fill a gap
    cur = None  # (doc, offset, wrapped) being consumed

    def take_next():
        nonlocal pos
        if pending:
            return pending.pop(0)
        item = (order[pos % n], 0, pos >= n)
        pos += 1
        return item

    def emit(doc, start, length, wrap):
        docs.append(doc)
        starts.append(start)
        lens.append(length)
        wrapped.append(wrap)

    while True:
        room = seq_length
        while room > 0:
            if cur is None:
                cur = take_next()
            doc, off, wrap = cur
            rest = lengths[doc] - off
            gap = room - rest - 2
            if gap <= 0:  # fills the sample, cutting the document if needed
                take = room - 2
            elif gap >= 3:  # fits whole and leaves room for another piece
                take = rest
            elif rest > 3 - gap:  # would leave 1-2 tokens: shorten so that 3 remain
                take = rest - (3 - gap)
            else:  # a 1-2 token rest leaving 1-2 tokens: let a document that fills it go first
                fill = _find_filler(order, lengths, pos, n, room)
                pending.insert(0, cur)
                if fill is not None and fill < n:  # an unread document: swap it forward
                    order[pos], order[fill] = order[fill], order[pos]
                    cur = (order[pos], 0, False)
                    pos += 1
                elif fill is not None:  # only a re-read of the start (wrapped) fills it
                    cur = (order[fill - n], 0, True)
                else:  # a corpus of 1-2 token documents: pad the gap
                    pending.pop(0)
                    emit(doc, off, rest, wrap)
                    emit(PAD_PIECE, 0, gap, wrap)
                    cur, room = None, 0
                continue
            emit(doc, off, take, wrap)
            room -= take + 2
            cur = None if off + take == lengths[doc] else (doc, off + take, wrap)
        ptr.append(len(docs))
        # Stop once this epoch's own documents are used up; wrapped re-reads only complete
        # the last sample.
        if pos >= n and (cur is None or cur[2]) and all(item[2] for item in pending):
            break
    return Layout(numpy.asarray(ptr, numpy.int64), numpy.asarray(docs, numpy.int64),
                  numpy.asarray(starts, numpy.int64), numpy.asarray(lens, numpy.int32),
                  numpy.asarray(wrapped, bool))


def _find_filler(order, lengths, pos, n, room):
    """Position of a fresh document that can fill ``room`` alone: unread ones first (< n), else
    one re-read from the start (returned as n + index)."""
    for k in range(pos, min(n, pos + _LOOKAHEAD)):
        if lengths[order[k]] + 2 >= room:
            return k
    for k in range(min(n, _LOOKAHEAD)):
        if lengths[order[k]] + 2 >= room:
            return n + k
    return None


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
