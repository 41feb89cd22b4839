/* gnnssd io_engine: row copies that run once per row (millions per mega-batch), in C: the
 * row reader's copy out of its staging area, and the gather of a mini-batch's x from the
 * levels its rows live on. */
#include <pthread.h>
#include <string.h>

#include "gio.h"

void gio_rows_copy(const uint8_t *src, const int64_t *pos, const int64_t *order, size_t n,
                   int64_t row_bytes, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        int64_t to = order ? order[i] : (int64_t)i;
        memcpy(out + to * row_bytes, src + pos[i], (size_t)row_bytes);
    }
}

/* Rows looked ahead of the one copied: x's rows come from anywhere in sources of hundreds
 * of MiB, so each copy would wait for memory; touching rows k+AHEAD's lines first keeps
 * several rows' loads in flight. */
#define AHEAD 16

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
/* x is written once and read later by its consumer, far beyond the caches for a real
 * mini-batch (hundreds of MiB): streaming stores skip reading each destination line into
 * the cache before overwriting it (a third of the memory traffic). 16-byte aligned rows of
 * a multiple of 64 bytes only. */
static int streamable(const uint8_t *out, int64_t row_bytes)
{
    return row_bytes % 64 == 0 && (uintptr_t)out % 16 == 0;
}

static inline void stream_row(uint8_t *dst, const uint8_t *src, int64_t row_bytes)
{
    for (int64_t j = 0; j < row_bytes; j += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + j));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + j + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + j + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + j + 48));
        _mm_stream_si128((__m128i *)(dst + j), a);
        _mm_stream_si128((__m128i *)(dst + j + 16), b);
        _mm_stream_si128((__m128i *)(dst + j + 32), c);
        _mm_stream_si128((__m128i *)(dst + j + 48), d);
    }
}

static inline void stream_fence(void)
{
    _mm_sfence();
}
#else
static int streamable(const uint8_t *out, int64_t row_bytes)
{
    (void)out;
    (void)row_bytes;
    return 0;
}

static inline void stream_row(uint8_t *dst, const uint8_t *src, int64_t row_bytes)
{
    memcpy(dst, src, (size_t)row_bytes);
}

static inline void stream_fence(void) {}
#endif

struct gather_part {
    uint8_t *const *sources;
    const int8_t *level;
    const int64_t *slot, *at;
    size_t lo, hi;
    int64_t row_bytes;
    uint8_t *out;
    int stream;
};

static void *gather_part(void *arg)
{
    const struct gather_part *g = arg;
    const int64_t rb = g->row_bytes;
    for (size_t k = g->lo; k < g->hi; k++) {
        if (k + AHEAD < g->hi) {
            const uint8_t *next = g->sources[g->level[k + AHEAD]] + g->slot[k + AHEAD] * rb;
            for (int64_t j = 0; j < rb; j += 64)
                __builtin_prefetch(next + j, 0, 0);
        }
        const uint8_t *src = g->sources[g->level[k]] + g->slot[k] * rb;
        uint8_t *dst = g->out + (g->at ? g->at[k] : (int64_t)k) * rb;
        if (g->stream)
            stream_row(dst, src, rb);
        else
            memcpy(dst, src, (size_t)rb);
    }
    if (g->stream)
        stream_fence();
    return NULL;
}

int64_t gio_rows_gather(uint8_t *const *sources, const int64_t *source_rows, int nsources,
                        const int8_t *level, const int64_t *slot, const int64_t *at, size_t n,
                        int64_t row_bytes, uint8_t *out, int64_t out_rows, int threads)
{
    for (size_t k = 0; k < n; k++) {  /* every row checked before any is copied */
        int64_t to = at ? at[k] : (int64_t)k;
        if (level[k] < 0 || level[k] >= nsources || slot[k] < 0 || slot[k] >= source_rows[level[k]] ||
            to < 0 || to >= out_rows)
            return (int64_t)k;
    }
    enum { MAX_THREADS = 64, MIN_ROWS = 4096 };  /* rows a thread is worth starting for */
    int parts = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    if ((size_t)parts * MIN_ROWS > n)
        parts = n / MIN_ROWS > 0 ? (int)(n / MIN_ROWS) : 1;
    struct gather_part part[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    int stream = streamable(out, row_bytes) && (uint64_t)n * (uint64_t)row_bytes >= GIO_GATHER_STREAM_BYTES;
    for (int p = 0; p < parts; p++) {
        part[p] = (struct gather_part){sources, level, slot, at, n * p / parts, n * (p + 1) / parts, row_bytes,
                                       out, stream};
        /* the caller takes part 0; a part whose thread cannot start runs here too */
        if (p > 0)
            started[p] = pthread_create(&tid[p], NULL, gather_part, &part[p]) == 0;
    }
    gather_part(&part[0]);
    for (int p = 1; p < parts; p++) {
        if (started[p])
            pthread_join(tid[p], NULL);
        else
            gather_part(&part[p]);
    }
    return -1;
}
