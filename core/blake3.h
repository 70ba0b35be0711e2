/*
 * core/blake3.h — BLAKE3 (the hash mode, 32-byte output), written from the
 * BLAKE3 specification (O'Connor, Aumasson, Neves, Wilcox-O'Hearn, 2020).
 *
 * Why here: the model fingerprint (engine/model/fingerprint.c) hashes every
 * byte of a model file on a first start. SHA-256 on a CPU's SHA instructions
 * runs ~1.8 GB/s a core; BLAKE3's chunks are independent, so eight of them
 * go through one AVX2 compression at a time (~3x that on a Zen 4 core), and
 * it is as collision-resistant as the fingerprint needs (DESIGN.md, block
 * hashes).
 *
 * The AVX2 path is chosen at run time (a build for any x86-64 CPU, as the
 * Debian package's, has it too); kvt_blake3_portable is the plain reference
 * the tests hold it to, and tests/ref/blake3_ref.txt (made by
 * tests/ref/gen_blake3_refs.py with the PyPI blake3 package) holds both to
 * the specification's outputs.
 */
#ifndef KVT_BLAKE3_H
#define KVT_BLAKE3_H

#include <stddef.h>
#include <stdint.h>

/* BLAKE3 of n bytes at data into out; thread-safe, allocates nothing. */
void kvt_blake3(const void *data, size_t n, uint8_t out[32]);

/* The same with no SIMD (the reference). */
void kvt_blake3_portable(const void *data, size_t n, uint8_t out[32]);

/* Which path kvt_blake3 takes on this CPU: "avx2" or "portable". */
const char *kvt_blake3_impl(void);

#endif
