/*
 * Reference outputs for headcount-core's assignor tests. C++, so that the jump function is the
 * paper's text as printed.
 *
 * Build and run (any C++ compiler with IEEE-754 doubles, e.g. g++ on x86-64):
 *
 *     g++ -O2 -o /tmp/hc-reference reference.cc && /tmp/hc-reference > reference.txt
 *
 * - JumpConsistentHash: the reference code printed in Lamping & Veach, "A Fast, Minimal Memory,
 *   Consistent Hash Algorithm" (arXiv 1406.2294), figure 1, unchanged.
 * - Hash128to64: CityHash's Hash128to64 (city.h), which RavenDB calls CombineHash(x, y) with
 *   x as the high 64 bits and y as the low 64 bits.
 * - WhoseTaskIsIt: RavenDB's failover loop as the DZone article "Distributed Task Assignment With
 *   Failover" (Oren Eini) describes it: copy the topology, and while the preferred entry is
 *   disabled, remove it and re-hash the key with CombineHash(key, remaining count). Written
 *   naively here, with a real array and memmove, to check the allocation-free Rust version.
 *
 * Output lines:
 *     jump <key> <buckets> <bucket>
 *     combine <x> <y> <hash>
 *     failover <key> <slots> <dead-mask-hex> <owner>
 * all numbers in decimal except the mask.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int32_t JumpConsistentHash(uint64_t key, int32_t num_buckets) {
    int64_t b = -1, j = 0;
    while (j < num_buckets) {
        b = j;
        key = key * 2862933555777941757ULL + 1;
        j = (b + 1) * (double(1LL << 31) / double((key >> 33) + 1));
    }
    return b;
}

static uint64_t Hash128to64(uint64_t high, uint64_t low) {
    const uint64_t kMul = 0x9ddfea08eb382d69ULL;
    uint64_t a = (low ^ high) * kMul;
    a ^= (a >> 47);
    uint64_t b = (high ^ a) * kMul;
    b ^= (b >> 47);
    b *= kMul;
    return b;
}

static uint64_t CombineHash(uint64_t x, uint64_t y) { return Hash128to64(x, y); }

/* slots <= 64; dead is a bit mask; returns -1 when every slot is dead. */
static int WhoseTaskIsIt(int slots, uint64_t dead, uint64_t key) {
    int ids[64];
    int count = slots;
    for (int i = 0; i < slots; i++) ids[i] = i;
    while (count > 0) {
        int index = JumpConsistentHash(key, count);
        int id = ids[index];
        if (!((dead >> id) & 1)) return id;
        memmove(&ids[index], &ids[index + 1], (size_t)(count - index - 1) * sizeof(int));
        count--;
        key = CombineHash(key, (uint64_t)count);
    }
    return -1;
}

static uint64_t splitmix_state = 0x0123456789abcdefULL;
static uint64_t splitmix64(void) {
    uint64_t z = (splitmix_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

int main(void) {
    static const uint64_t fixed_keys[] = {
        0, 1, 2, 3, 4, 5, 7, 42, 128, 129, 256, 0xDEAD10CCULL, 0xdeadbeefULL,
        0x0ddc0ffeebadf00dULL, 0x8000000000000000ULL, 0xffffffffffffffffULL,
    };
    static const int32_t buckets[] = {
        1, 2, 3, 4, 5, 7, 10, 11, 57, 100, 128, 666, 1000, 1024, 4096, 65536, 1000000,
        100000000, 2147483647,
    };
    uint64_t keys[16 + 48];
    int nkeys = 0;
    for (size_t i = 0; i < sizeof fixed_keys / sizeof fixed_keys[0]; i++) keys[nkeys++] = fixed_keys[i];
    for (int i = 0; i < 48; i++) keys[nkeys++] = splitmix64();

    for (int k = 0; k < nkeys; k++)
        for (size_t b = 0; b < sizeof buckets / sizeof buckets[0]; b++)
            printf("jump %llu %d %d\n", (unsigned long long)keys[k], buckets[b],
                   JumpConsistentHash(keys[k], buckets[b]));

    for (int k = 0; k < nkeys; k++) {
        uint64_t y = (k % 3 == 0) ? (uint64_t)k : splitmix64();
        printf("combine %llu %llu %llu\n", (unsigned long long)keys[k], (unsigned long long)y,
               (unsigned long long)CombineHash(keys[k], y));
    }

    for (int t = 0; t < 400; t++) {
        int slots = 1 + (int)(splitmix64() % 40);
        uint64_t dead = splitmix64() & splitmix64(); /* about a quarter dead */
        if (t % 4 == 1) dead |= splitmix64();         /* some with most dead */
        if (slots < 64) dead &= (1ULL << slots) - 1;
        if (dead == ((slots < 64) ? (1ULL << slots) - 1 : ~0ULL)) dead &= ~1ULL; /* keep one live */
        uint64_t key = splitmix64();
        printf("failover %llu %d %llx %d\n", (unsigned long long)key, slots,
               (unsigned long long)dead, WhoseTaskIsIt(slots, dead, key));
    }
    return 0;
}
