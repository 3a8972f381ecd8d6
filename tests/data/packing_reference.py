"""A slow, obviously sequential packer: the reference the vectorised one must equal exactly."""

PAD = -1


def reference_pack(lengths, seq_length):
    """Samples as lists of (stream position j, start, length); j >= n re-reads document j - n."""
    order = [i for i, n in enumerate(lengths) if n > 0]
    n = len(order)
    samples, j, off = [], 0, 0
    while j < n:  # a sample starts while the epoch's own documents are not used up
        room, pieces = seq_length, []
        while room:
            rest = lengths[order[j % n]] - off
            free = room - rest - 2
            if free == 0 or free >= 3:  # the document fits whole
                pieces.append([j, off, rest])
                room, j, off = free, j + 1, 0
            elif free < 0:  # cut: the rest opens the next sample
                pieces.append([j, off, room - 2])
                off, room = off + room - 2, 0
            else:  # a 1-2 token gap
                can_split = lambda: any(p[2] >= 2 for p in pieces)
                if free == 1 and rest >= 2 and (rest >= 3 or can_split()):
                    pieces.append([j, off, rest - 1])  # the last token opens the next sample
                    off += rest - 1
                    _split_last_big(pieces)
                elif free == 1 and rest == 1 and sum(p[2] - 1 for p in pieces) >= 2:
                    _split_last_big(pieces)  # the 1-token document opens the next sample
                    _split_last_big(pieces)
                else:
                    pieces.append([j, off, rest])
                    j, off = j + 1, 0
                    if free == 2 and can_split():
                        _split_last_big(pieces)
                    else:
                        pieces.append([PAD, 0, free])
                room = 0
        samples.append(pieces)
    return [[(order[p[0] % n] if p[0] != PAD else PAD, p[1], p[2], p[0] >= n) for p in s]
            for s in samples]


def _split_last_big(pieces):
    k = max(i for i, p in enumerate(pieces) if p[2] >= 2)
    j, start, length = pieces[k]
    pieces[k:k + 1] = [[j, start, length // 2], [j, start + length // 2, length - length // 2]]
