/*
 * replay.c - the lane's replay cache: the nonces accepted within the window, in a ring
 * (struct replay, lane.h), the one Python's decoding of the lane's socket asks too.
 */
#define _GNU_SOURCE

#include "lane.h"

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void *zero_pages(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void unmap(void *p, size_t bytes)
{
    if (p != NULL)
        munmap(p, bytes);
}

static uint32_t nonce_hash(const uint8_t *n, uint32_t nbuckets)
{
    uint32_t h;
    memcpy(&h, n, sizeof h); /* nonces are random: their bytes are the hash */
    return h & (nbuckets - 1);
}

int lane_replay_init(struct replay *r, int64_t window_ns, uint32_t cap)
{
    r->window_ns = window_ns;
    r->cap = cap;
    r->nbuckets = 1; /* chains of four nonces on average when full */
    while (r->nbuckets < cap / 4)
        r->nbuckets <<= 1;
    r->head = r->count = 0;
    r->nonce = zero_pages((size_t)cap * GECO_NONCE_BYTES);
    r->seen = zero_pages((size_t)cap * sizeof *r->seen);
    r->chain = zero_pages((size_t)cap * sizeof *r->chain);
    r->bucket = zero_pages((size_t)r->nbuckets * sizeof *r->bucket);
    if (!r->nonce || !r->seen || !r->chain || !r->bucket)
        return -1;
    return pthread_mutex_init(&r->mu, NULL) == 0 ? 0 : -1;
}

void lane_replay_free(struct replay *r)
{
    unmap(r->nonce, (size_t)r->cap * GECO_NONCE_BYTES);
    unmap(r->seen, (size_t)r->cap * sizeof *r->seen);
    unmap(r->chain, (size_t)r->cap * sizeof *r->chain);
    unmap(r->bucket, (size_t)r->nbuckets * sizeof *r->bucket);
}

/* Give back the pages of an array of `size`-byte slots that the ring's head has just
   left: slots [from, from + n) expired now (the ring may wrap), and with them the page
   they began in when its slots before `from` are free too (`free_before`: the free slots
   before `from`, which the tail fills next; a page with a live slot, the tail's on a
   nearly full ring, is kept). A syscall only when the head crosses a page. */
static void release_slots(void *base, size_t size, uint32_t cap, uint32_t from, uint32_t n,
                          uint32_t free_before)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), per = page / size;
    if (per == 0 || page % size != 0 || cap % per != 0)
        return; /* pages and slots do not line up: keep everything */
    /* unwrapped (shifted by cap): dead slots are [start, end), live ones outside */
    uint64_t head = (uint64_t)from + cap, end = head + n;
    uint64_t start = head - free_before, own_page = head / per * per;
    if (start < own_page)
        start = own_page; /* pages before the head's were given back before */
    uint64_t first = (start + per - 1) / per, last = end / per; /* whole pages only */
    uint64_t pages = cap / per;
    for (uint64_t p = first; p < last;) {
        uint64_t at = p % pages, run = last - p;
        if (run > pages - at)
            run = pages - at; /* up to the array's end; the rest wraps to its start */
        madvise((char *)base + at * page, run * page, MADV_DONTNEED);
        p += run;
    }
}

static void replay_drop_oldest(struct replay *r)
{
    uint32_t old = r->head, *link = &r->bucket[nonce_hash(r->nonce[old], r->nbuckets)];
    while (*link != old + 1)
        link = &r->chain[*link - 1];
    *link = r->chain[old];
    r->head = (r->head + 1) % r->cap;
    r->count--;
}

int lane_replay_check(struct replay *r, const uint8_t *nonce, int64_t now)
{
    pthread_mutex_lock(&r->mu);
    uint32_t head = r->head, dropped = 0;
    while (r->count > 0 && now - r->seen[r->head] > r->window_ns) {
        replay_drop_oldest(r);
        dropped++;
    }
    if (dropped > 0) {
        uint32_t free_before = r->cap - r->count - dropped; /* free before the drop */
        release_slots(r->nonce, GECO_NONCE_BYTES, r->cap, head, dropped, free_before);
        release_slots(r->seen, sizeof *r->seen, r->cap, head, dropped, free_before);
        release_slots(r->chain, sizeof *r->chain, r->cap, head, dropped, free_before);
    }
    uint32_t b = nonce_hash(nonce, r->nbuckets);
    int rc = 0;
    for (uint32_t link = r->bucket[b]; link != 0; link = r->chain[link - 1]) {
        if (memcmp(r->nonce[link - 1], nonce, GECO_NONCE_BYTES) == 0) {
            rc = 1;
            goto out;
        }
    }
    if (r->count >= r->cap) {
        rc = 2;
        goto out;
    }
    uint32_t slot = (r->head + r->count) % r->cap;
    memcpy(r->nonce[slot], nonce, GECO_NONCE_BYTES);
    r->seen[slot] = now;
    r->chain[slot] = r->bucket[b];
    r->bucket[b] = slot + 1;
    r->count++;
out:
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int geco_lane_replay_check(geco_lane_t *lane, const uint8_t nonce[GECO_NONCE_BYTES],
                           int64_t now_ns)
{
    return lane_replay_check(&lane->replay, nonce, now_ns);
}

uint32_t geco_lane_replay_size(geco_lane_t *lane)
{
    pthread_mutex_lock(&lane->replay.mu);
    uint32_t n = lane->replay.count;
    pthread_mutex_unlock(&lane->replay.mu);
    return n;
}
