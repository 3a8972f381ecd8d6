/* The MLM dataset's layout build, compiled at first use by native.py: the passes that walk or permute one element
   at a time, which numpy does with a cache miss at each. Without a compiler, the callers' numpy paths give the same
   results. */
#include <stdint.h>

/* The packed layout's sample starts, in one pass over the documents: the sequential walk that packing.py's
   docstring describes (tests/data/packing_reference.py spells it out piece by piece), keeping of each sample only
   where it starts.

   The n documents of the epoch are lengths[order[0]], ..., lengths[order[n - 1]] (lengths[0..n-1] when order is
   NULL), each > 0; stream positions >= n re-read position % n. Writes the stream position and token offset of each
   sample's start and returns the number of samples, or -1 when there are more than capacity. The length PREFETCH
   documents ahead is fetched early: a corpus's lengths in epoch order are reads all over memory. */
#define PREFETCH 16
#define PACK_STARTS(NAME, POSITION_T, ORDER_T)                                                               \
    int64_t NAME(const int32_t *lengths, const ORDER_T *order, int64_t n, int64_t seq_length,                \
                 POSITION_T *position, int32_t *offset, int64_t capacity) {                                  \
        int64_t samples = 0, j = 0, off = 0;                                                                 \
        while (j < n) { /* a sample starts while the epoch's own documents are not used up */                \
            if (samples == capacity) return -1;                                                              \
            position[samples] = (POSITION_T)j;                                                               \
            offset[samples++] = (int32_t)off;                                                                \
            /* excess: the sample's whole pieces' tokens beyond one each; big: one of them has >= 2 */       \
            int64_t room = seq_length, excess = 0;                                                           \
            int big = 0;                                                                                     \
            while (room) {                                                                                   \
                int64_t k = j < n ? j : j % n;                                                               \
                if (order && k + PREFETCH < n) __builtin_prefetch(&lengths[order[k + PREFETCH]]);            \
                int64_t rest = (int64_t)lengths[order ? (int64_t)order[k] : k] - off;                        \
                int64_t free = room - rest - 2;                                                              \
                if (free == 0 || free >= 3) { /* the document fits whole */                                  \
                    big |= rest >= 2;                                                                        \
                    excess += rest - 1;                                                                      \
                    room = free, ++j, off = 0;                                                               \
                } else if (free < 0) { /* cut: the rest opens the next sample */                             \
                    off += room - 2, room = 0;                                                               \
                } else { /* a 1-2 token gap, filled by splits or a [PAD] piece */                            \
                    if (free == 1 && rest >= 2 && (rest >= 3 || big))                                        \
                        off += rest - 1; /* the last token opens the next sample */                          \
                    else if (!(free == 1 && rest == 1 && excess >= 2))                                       \
                        ++j, off = 0; /* (else the 1-token document opens the next sample) */                \
                    room = 0;                                                                                \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
        return samples;                                                                                      \
    }

PACK_STARTS(pack_starts_int32_int32, int32_t, int32_t)
PACK_STARTS(pack_starts_int32_int64, int32_t, int64_t)
PACK_STARTS(pack_starts_int64_int32, int64_t, int32_t)
PACK_STARTS(pack_starts_int64_int64, int64_t, int64_t)

/* numpy's Generator.shuffle of a 1-D array (numpy/random/_generator.pyx, _shuffle_raw, and random_interval in
   distributions.c): the same draws from the bit generator, in the same order, so the same permutation and the same
   generator state after. The swaps' targets are drawn AHEAD steps early, their elements fetched while the swaps
   before them run: numpy waits for memory at each swap, about four times as long for an array larger than the
   CPU's caches. next_uint32 / next_uint64 and state are the bit generator's own (BitGenerator.ctypes). */
typedef uint32_t (*next_uint32_t)(void *);
typedef uint64_t (*next_uint64_t)(void *);

static inline uint64_t random_interval(void *state, next_uint32_t next_uint32, next_uint64_t next_uint64,
                                       uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max, value;
    mask |= mask >> 1, mask |= mask >> 2, mask |= mask >> 4, mask |= mask >> 8, mask |= mask >> 16;
    mask |= mask >> 32;
    if (max <= 0xffffffffUL)
        while ((value = (next_uint32(state) & mask)) > max);
    else
        while ((value = (next_uint64(state) & mask)) > max);
    return value;
}

#define AHEAD 32
#define SHUFFLE(NAME, T)                                                                                     \
    void NAME(void *state, void *next_uint32, void *next_uint64, T *x, int64_t n) {                          \
        int64_t target[AHEAD], i = n - 1;                                                                    \
        while (i >= 1) {                                                                                     \
            int64_t steps = i < AHEAD ? i : AHEAD;                                                           \
            for (int64_t s = 0; s < steps; ++s) {                                                            \
                target[s] = (int64_t)random_interval(state, (next_uint32_t)next_uint32,                      \
                                                     (next_uint64_t)next_uint64, (uint64_t)(i - s));         \
                __builtin_prefetch(&x[target[s]], 1);                                                        \
            }                                                                                                \
            for (int64_t s = 0; s < steps; ++s, --i) {                                                       \
                T swapped = x[target[s]];                                                                    \
                x[target[s]] = x[i];                                                                         \
                x[i] = swapped;                                                                              \
            }                                                                                                \
        }                                                                                                    \
    }

SHUFFLE(shuffle_int32, int32_t)
SHUFFLE(shuffle_int64, int64_t)
