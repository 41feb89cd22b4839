/* gnnssd io_engine: engine life cycle, the shared request queue, batches, the thread-pool
 * backend and file opening. The io_uring driver lives in gio_uring.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gio_internal.h"

int gio_have_uring(void)
{
#ifdef GIO_HAVE_LIBURING
    return 1;
#else
    return 0;
#endif
}

/* ---- queue ------------------------------------------------------------------------ */

size_t gio_claim(gio_engine *eng, gio_req *out, size_t max, int nonblock)
{
    size_t k = 0;
    pthread_mutex_lock(&eng->mu);
    if (!nonblock)
        while (!eng->head && !eng->stopping)
            pthread_cond_wait(&eng->cv, &eng->mu);
    while (k < max && eng->head) {
        gio_batch *b = eng->head;
        while (k < max && b->next < b->n) {
            out[k].b = b;
            out[k].i = b->next++;
            k++;
        }
        if (b->next == b->n) {
            eng->head = b->qnext;
            if (!eng->head)
                eng->tail = NULL;
        }
    }
    pthread_mutex_unlock(&eng->mu);
    return k;
}

/* Count b's dropped requests as finished (and b as cancelled). b stays alive until here:
 * its remaining count holds the dropped requests, which nobody else can finish. */
static void finish_dropped(gio_batch *b, size_t dropped, int cancelled)
{
    pthread_mutex_lock(&b->mu);
    b->cancelled |= cancelled;
    b->remaining -= dropped;
    if (b->remaining == 0)
        pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* Take b's unclaimed requests off the queue and count them as finished. The caller keeps
 * b alive: it holds an unfinished request of b, or it is b's owner. */
static void drop_unclaimed(gio_batch *b, int cancelled)
{
    gio_engine *eng = b->eng;
    size_t dropped;
    pthread_mutex_lock(&eng->mu);
    dropped = b->n - b->next;
    if (dropped) {
        gio_batch **link = &eng->head, *prev = NULL;
        while (*link && *link != b) {
            prev = *link;
            link = &(*link)->qnext;
        }
        if (*link) {
            *link = b->qnext;
            if (eng->tail == b)
                eng->tail = prev;
        }
        b->next = b->n;
    }
    pthread_mutex_unlock(&eng->mu);
    if (dropped)
        finish_dropped(b, dropped, cancelled);
}

void gio_complete(gio_batch *b, size_t i, int err)
{
    int64_t bad_page = -1;
    uint32_t bad_crc = 0;
    if (!err && b->crcs &&
        gio_verify_pages(b->buf + b->dests[i], b->offsets[i], b->lengths[i], b->crcs,
                         b->ncrcs, &bad_page, &bad_crc))
        err = EBADMSG;
    if (err)  /* fail fast: the batch is lost anyway; b is alive while request i is open */
        drop_unclaimed(b, 0);
    pthread_mutex_lock(&b->mu);
    if (err && (!b->err || i < b->err_index)) {
        b->err = err;
        b->err_index = i;
        b->bad_page = bad_page;
        b->bad_crc = bad_crc;
    }
    if (--b->remaining == 0)
        pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void gio_abandon(gio_batch *b)
{
    pthread_mutex_lock(&b->mu);
    b->abandoned = 1;
    pthread_mutex_unlock(&b->mu);
}

int gio_batch_abandoned(gio_batch *b)
{
    int a;
    pthread_mutex_lock(&b->mu);
    a = b->abandoned;
    pthread_mutex_unlock(&b->mu);
    return a;
}

int gio_finish_at_eof(gio_batch *b, size_t i, int64_t done)
{
    if (b->offsets[i] + done < b->file_size)
        return ENODATA;  /* the file shrank below the size it had when opened */
    memset(b->buf + b->dests[i] + done, 0, (size_t)(b->lengths[i] - done));
    return 0;
}

/* ---- batches ------------------------------------------------------------------------ */

gio_batch *gio_submit(gio_engine *eng, int fd, int64_t file_size, const int64_t *offsets,
                      const int64_t *lengths, const int64_t *dests, uint8_t *buf, size_t n,
                      const uint32_t *crcs, int64_t ncrcs)
{
    pthread_condattr_t ca;
    gio_batch *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    b->eng = eng;
    b->fd = fd;
    b->file_size = file_size;
    b->offsets = offsets;
    b->lengths = lengths;
    b->dests = dests;
    b->buf = buf;
    b->n = n;
    b->crcs = crcs;
    b->ncrcs = ncrcs;
    b->bad_page = -1;
    b->remaining = n;
    pthread_mutex_init(&b->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (n == 0)
        return b;

    pthread_mutex_lock(&eng->mu);
    if (eng->stopping) {  /* the engine is closing: nothing will run this batch */
        b->next = n;
        b->remaining = 0;
        b->cancelled = 1;
    } else {
        if (eng->tail)
            eng->tail->qnext = b;
        else
            eng->head = b;
        eng->tail = b;
        pthread_cond_broadcast(&eng->cv);
    }
    pthread_mutex_unlock(&eng->mu);
    return b;
}

int gio_batch_wait(gio_batch *b, int timeout_ms)
{
    int done, rc = 0;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&b->mu);
    while (b->remaining && rc != ETIMEDOUT) {
        if (timeout_ms < 0)
            pthread_cond_wait(&b->cv, &b->mu);
        else
            rc = pthread_cond_timedwait(&b->cv, &b->mu, &deadline);
    }
    done = b->remaining == 0;
    pthread_mutex_unlock(&b->mu);
    return done;
}

int gio_batch_done(gio_batch *b)
{
    int done;
    pthread_mutex_lock(&b->mu);
    done = b->remaining == 0;
    pthread_mutex_unlock(&b->mu);
    return done;
}

void gio_batch_cancel(gio_batch *b)
{
    drop_unclaimed(b, 1);
}

int gio_batch_cancelled(gio_batch *b)
{
    int c;
    pthread_mutex_lock(&b->mu);
    c = b->cancelled;
    pthread_mutex_unlock(&b->mu);
    return c;
}

int gio_batch_error(gio_batch *b, size_t *index, int64_t *bad_page, uint32_t *bad_crc)
{
    int err;
    pthread_mutex_lock(&b->mu);
    err = b->err;
    *index = b->err_index;
    *bad_page = b->bad_page;
    *bad_crc = b->bad_crc;
    pthread_mutex_unlock(&b->mu);
    return err;
}

void gio_batch_free(gio_batch *b)
{
    if (!b || !gio_batch_done(b))
        return;  /* a worker may still touch it: leaking beats a use after free */
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b);
}

/* ---- thread-pool backend ------------------------------------------------------------ */

static int pread_request(gio_batch *b, size_t i)
{
    const int64_t off = b->offsets[i], len = b->lengths[i];
    uint8_t *dst = b->buf + b->dests[i];
    int64_t done = 0;
    while (done < len) {
        int64_t want = len - done < GIO_MAX_IO ? len - done : GIO_MAX_IO;
        ssize_t r = pread(b->fd, dst + done, (size_t)want, off + done);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return errno;
        }
        done += r;
        if (r == 0 || (done < len && off + done >= b->file_size))
            return gio_finish_at_eof(b, i, done);
    }
    return 0;
}

static void *thread_main(void *arg)
{
    gio_engine *eng = arg;
    gio_req r;
    while (gio_claim(eng, &r, 1, 0))
        gio_complete(r.b, r.i, pread_request(r.b, r.i));
    return NULL;
}

/* ---- engine ------------------------------------------------------------------------- */

static void stop_workers(gio_engine *eng)
{
    pthread_mutex_lock(&eng->mu);
    eng->stopping = 1;
    pthread_cond_broadcast(&eng->cv);
    pthread_mutex_unlock(&eng->mu);
    for (int i = 0; i < eng->nworkers; i++)
        pthread_join(eng->workers[i], NULL);
    free(eng->workers);
    eng->workers = NULL;
    eng->nworkers = 0;
    free(eng->rings);
    eng->rings = NULL;
}

static int start_threads(gio_engine *eng, int threads)
{
    eng->workers = calloc((size_t)threads, sizeof(pthread_t));
    if (!eng->workers)
        return ENOMEM;
    for (int i = 0; i < threads; i++) {
        int rc = pthread_create(&eng->workers[i], NULL, thread_main, eng);
        if (rc) {
            stop_workers(eng);
            return rc;
        }
        eng->nworkers++;
    }
    return 0;
}

gio_engine *gio_engine_new(int backend, int queue_depth, int rings, int threads, int flags,
                           int *err, int *uring_err)
{
    gio_engine *eng;
    *err = 0;
    *uring_err = 0;
    if (queue_depth < 1 || rings < 1 || threads < 1) {
        *err = EINVAL;
        return NULL;
    }
    eng = calloc(1, sizeof(*eng));
    if (!eng) {
        *err = ENOMEM;
        return NULL;
    }
    eng->queue_depth = queue_depth;
    eng->flags = flags;
    pthread_mutex_init(&eng->mu, NULL);
    pthread_cond_init(&eng->cv, NULL);

    if (backend != GIO_BACKEND_THREADS) {
        int rc = gio_have_uring() ? gio_uring_start(eng, rings, uring_err) : ENOSYS;
        if (!gio_have_uring())
            *uring_err = ENOSYS;
        if (rc == 0) {
            eng->backend = GIO_BACKEND_URING;
            return eng;
        }
        if (backend == GIO_BACKEND_URING) {
            *err = rc;
            gio_engine_free(eng);
            return NULL;
        }
        stop_workers(eng);  /* the rings that did start before one failed */
        eng->stopping = 0;
    }
    eng->backend = GIO_BACKEND_THREADS;
    *err = start_threads(eng, threads);
    if (*err) {
        gio_engine_free(eng);
        return NULL;
    }
    return eng;
}

int gio_engine_backend(const gio_engine *eng)
{
    return eng->backend;
}

void gio_engine_free(gio_engine *eng)
{
    if (!eng)
        return;
    /* Stop taking work and drop what is queued (owners see their batches cancelled);
     * the workers then finish the reads in flight and exit. */
    gio_batch *b;
    pthread_mutex_lock(&eng->mu);
    eng->stopping = 1;
    b = eng->head;
    for (gio_batch *q = b; q; q = q->qnext) {
        q->dropped = q->n - q->next;
        q->next = q->n;
    }
    eng->head = eng->tail = NULL;
    pthread_mutex_unlock(&eng->mu);
    while (b) {
        gio_batch *next = b->qnext;  /* the queue's last batch has none */
        finish_dropped(b, b->dropped, 1);  /* b may be freed from here on */
        b = next;
    }
    stop_workers(eng);
    pthread_mutex_destroy(&eng->mu);
    pthread_cond_destroy(&eng->cv);
    free(eng);
}

/* ---- files ---------------------------------------------------------------------------- */

/* The alignment O_DIRECT needs for offsets/lengths and for memory: statx's DIOALIGN where
 * the kernel reports it, the logical sector size of a block device, else one page. */
static void dio_alignment(int fd, const struct stat *st, int *offset_align, int *mem_align)
{
    *offset_align = *mem_align = GIO_DIO_ALIGN;
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
        (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align) {
        *offset_align = (int)sx.stx_dio_offset_align;
        *mem_align = (int)sx.stx_dio_mem_align;
        return;
    }
#endif
    if (S_ISBLK(st->st_mode)) {
        int ssz;
        if (ioctl(fd, BLKSSZGET, &ssz) == 0 && ssz > 0)
            *offset_align = *mem_align = ssz;
    }
}

int gio_open(const char *path, int direct, int64_t *size, int *offset_align, int *mem_align,
             int *err)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    if (fstat(fd, &st) != 0) {
        *err = errno;
        close(fd);
        return -1;
    }
    *size = st.st_size;
    if (S_ISBLK(st.st_mode)) {
        uint64_t bytes;
        if (ioctl(fd, BLKGETSIZE64, &bytes) == 0)
            *size = (int64_t)bytes;
    }
    *offset_align = *mem_align = 1;
    if (direct)
        dio_alignment(fd, &st, offset_align, mem_align);
    return fd;
}
