/* gnnssd io_engine: the io_uring backend. One driver thread per ring keeps up to
 * queue_depth reads in flight: it claims requests from the engine queue, submits them in
 * one io_uring_enter together with the wait for completions, resubmits short reads and
 * reports each finished request. The ring is created by its driver thread so that it can
 * be single-issuer. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>

#include "gio_internal.h"

#ifndef GIO_HAVE_LIBURING

int gio_uring_start(gio_engine *eng, int rings, int *uring_err)
{
    (void)eng;
    (void)rings;
    *uring_err = ENOSYS;
    return ENOSYS;
}

#else
#include <liburing.h>

struct gio_ring {
    gio_engine *eng;
    int started;  /* guarded by eng->mu; signalled on eng->cv */
    int err;      /* ring set-up errno, 0 when the ring is running */
};

typedef struct {
    gio_batch *b;
    size_t i;
    int64_t done;  /* bytes of request i read so far */
} slot_t;

static int setup_ring(struct io_uring *ring, unsigned entries, int flags)
{
    struct io_uring_params p = {0};
    unsigned base = 0;
    int rc;
    if (flags & GIO_FLAG_SQPOLL) {
        base |= IORING_SETUP_SQPOLL;
        p.sq_thread_idle = 1000;  /* ms the kernel thread spins before it sleeps */
    }
    if (flags & GIO_FLAG_IOPOLL)
        base |= IORING_SETUP_IOPOLL;
#if defined(IORING_SETUP_SINGLE_ISSUER) && defined(IORING_SETUP_DEFER_TASKRUN)
    if (!(flags & GIO_FLAG_SQPOLL)) {
        /* only this thread submits and reaps: let the kernel skip cross-task work */
        p.flags = base | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
        rc = io_uring_queue_init_params(entries, ring, &p);
        if (rc != -EINVAL)
            return rc;
        p = (struct io_uring_params){0};
    }
#endif
    p.flags = base;
    if (flags & GIO_FLAG_SQPOLL)
        p.sq_thread_idle = 1000;
    return io_uring_queue_init_params(entries, ring, &p);
}

static void prep(struct io_uring *ring, slot_t *s)
{
    const gio_batch *b = s->b;
    int64_t left = b->lengths[s->i] - s->done;
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);  /* never NULL: sq has queue_depth */
    io_uring_prep_read(sqe, b->fd, b->buf + b->dests[s->i] + s->done,
                       (unsigned)(left < GIO_MAX_IO ? left : GIO_MAX_IO),
                       (uint64_t)(b->offsets[s->i] + s->done));
    io_uring_sqe_set_data(sqe, s);
}

/* Account one completion of slot s: 1 when the rest must be read again, else 0 after
 * reporting the request finished. */
static int on_result(slot_t *s, int res)
{
    const gio_batch *b = s->b;
    if (res == -EAGAIN || res == -EINTR)
        return 1;
    if (res < 0) {
        gio_complete(s->b, s->i, -res);
        return 0;
    }
    s->done += res;
    if (s->done >= b->lengths[s->i]) {
        gio_complete(s->b, s->i, 0);
        return 0;
    }
    if (res == 0 || b->offsets[s->i] + s->done >= b->file_size) {
        gio_complete(s->b, s->i, gio_finish_at_eof(s->b, s->i, s->done));
        return 0;
    }
    return 1;  /* short read: continue where it stopped */
}

/* The ring failed with err: complete every request in flight with err. Requests the
 * kernel holds are completed as their CQEs arrive (their buffers are then free); those
 * it never consumed from the submission queue are completed at once. Should waiting fail
 * too, the rest are completed as abandoned: their owners must never free the buffers. */
static void drain_broken(struct io_uring *ring, gio_engine *eng, slot_t *slots,
                         size_t inflight, int err)
{
    const size_t qd = (size_t)eng->queue_depth;
    /* with SQPOLL the kernel thread may still pick up queued entries: wait for all */
    size_t unsent = (eng->flags & GIO_FLAG_SQPOLL) ? 0 : io_uring_sq_ready(ring);
    int abandon = 0;
    while (inflight > unsent) {
        struct __kernel_timespec ts = {.tv_sec = 1, .tv_nsec = 0};
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe_timeout(ring, &cqe, &ts);
        if (rc == -ETIME || rc == -EINTR || rc == -EAGAIN)
            continue;
        if (rc < 0) {
            abandon = 1;
            break;
        }
        slot_t *s = io_uring_cqe_get_data(cqe);
        io_uring_cqe_seen(ring, cqe);
        gio_complete(s->b, s->i, err);
        s->b = NULL;
        inflight--;
    }
    for (size_t k = 0; k < qd; k++)
        if (slots[k].b) {
            if (abandon)
                gio_abandon(slots[k].b);
            gio_complete(slots[k].b, slots[k].i, err);
            slots[k].b = NULL;
        }
}

/* After the ring broke: fail each request claimed until the engine stops. */
static void fail_until_stopped(gio_engine *eng, gio_req *reqs, size_t max, int err)
{
    size_t k;
    while ((k = gio_claim(eng, reqs, max, 0)) > 0)
        for (size_t j = 0; j < k; j++)
            gio_complete(reqs[j].b, reqs[j].i, err);
}

static void report_start(struct gio_ring *r, int err)
{
    pthread_mutex_lock(&r->eng->mu);
    r->started = 1;
    r->err = err;
    pthread_cond_broadcast(&r->eng->cv);
    pthread_mutex_unlock(&r->eng->mu);
}

static void *driver_main(void *arg)
{
    struct gio_ring *r = arg;
    gio_engine *eng = r->eng;
    const size_t qd = (size_t)eng->queue_depth;
    struct io_uring ring;
    slot_t *slots = calloc(qd, sizeof(*slots));
    slot_t **free_slots = calloc(qd, sizeof(*free_slots));
    gio_req *reqs = calloc(qd, sizeof(*reqs));
    size_t nfree = qd, inflight = 0;
    int rc = (slots && free_slots && reqs) ? setup_ring(&ring, (unsigned)qd, eng->flags)
                                           : -ENOMEM;
    report_start(r, -rc);
    if (rc < 0)
        goto out;
    for (size_t k = 0; k < qd; k++)
        free_slots[k] = &slots[k];

    for (;;) {
        unsigned head, seen = 0;
        struct io_uring_cqe *cqe;
        if (nfree) {
            /* block for work only when nothing is in flight */
            size_t k = gio_claim(eng, reqs, nfree, inflight > 0);
            if (k == 0 && inflight == 0)
                break;  /* stopping */
            for (size_t j = 0; j < k; j++) {
                slot_t *s;
                if (reqs[j].b->lengths[reqs[j].i] == 0) {
                    gio_complete(reqs[j].b, reqs[j].i, 0);
                    continue;
                }
                s = free_slots[--nfree];
                s->b = reqs[j].b;
                s->i = reqs[j].i;
                s->done = 0;
                prep(&ring, s);
                inflight++;
            }
        }
        if (inflight == 0)
            continue;
        rc = io_uring_submit_and_wait(&ring, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            /* The ring itself is broken (not a read error): drain it, close it and fail
             * every request from here on, so that no waiter hangs and no buffer is
             * handed back while the kernel may still write into it. */
            drain_broken(&ring, eng, slots, inflight, -rc);
            io_uring_queue_exit(&ring);
            fail_until_stopped(eng, reqs, qd, -rc);
            goto out;
        }
        io_uring_for_each_cqe(&ring, head, cqe) {
            slot_t *s = io_uring_cqe_get_data(cqe);
            seen++;
            if (on_result(s, cqe->res)) {
                prep(&ring, s);
            } else {
                s->b = NULL;
                free_slots[nfree++] = s;
                inflight--;
            }
        }
        io_uring_cq_advance(&ring, seen);
    }
    io_uring_queue_exit(&ring);
out:
    free(slots);
    free(free_slots);
    free(reqs);
    return NULL;
}

int gio_uring_start(gio_engine *eng, int rings, int *uring_err)
{
    eng->rings = calloc((size_t)rings, sizeof(struct gio_ring));
    eng->workers = calloc((size_t)rings, sizeof(pthread_t));
    if (!eng->rings || !eng->workers)
        return ENOMEM;
    for (int i = 0; i < rings; i++) {
        struct gio_ring *r = &eng->rings[i];
        int rc;
        r->eng = eng;
        rc = pthread_create(&eng->workers[i], NULL, driver_main, r);
        if (rc)
            return rc;
        eng->nworkers++;
        pthread_mutex_lock(&eng->mu);
        while (!r->started)
            pthread_cond_wait(&eng->cv, &eng->mu);
        rc = r->err;
        pthread_mutex_unlock(&eng->mu);
        if (rc) {
            *uring_err = rc;
            return rc;
        }
    }
    return 0;
}
#endif
