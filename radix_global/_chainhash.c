/* The SHA-256 page chain of radix_global/keys.py, compiled: the router computes it for every
 * request, and as a Python loop (three hashlib calls and a slice per page) it was the largest
 * single cost of the request path (docs/benchmarks.md, "Router overhead").
 *
 * chain_digests(data, page_bytes, prior) -> bytes
 *   data: the packed pages (bytes-like, a whole number of pages of page_bytes bytes each);
 *   prior: the digest the chain continues from (32 bytes), or b"" to start from nothing.
 *   Returns the digests of all pages, 32 bytes each, concatenated:
 *   digest_i = SHA-256(digest_{i-1} || page_i), digest_{-1} = prior.
 *
 * Same contract as the pure-Python loop it replaces (keys._chain_py); tests compare the two.
 * SHA-256 is OpenSSL's (libcrypto, the library hashlib itself uses). The GIL is kept: a page
 * chain takes microseconds, less than handing the GIL over would cost the event loop.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/evp.h>

#define DIGEST_LEN 32

static EVP_MD *sha256_md; /* fetched once: an implicit fetch per page costs a lookup */

static PyObject *chain_digests(PyObject *self, PyObject *args) {
    Py_buffer data, prior;
    Py_ssize_t page_bytes;
    PyObject *out = NULL;
    EVP_MD_CTX *ctx = NULL;

    if (!PyArg_ParseTuple(args, "y*ny*", &data, &page_bytes, &prior))
        return NULL;
    if (page_bytes < 1) {
        PyErr_Format(PyExc_ValueError, "page_bytes must be >= 1, got %zd", page_bytes);
        goto done;
    }
    if (data.len % page_bytes != 0) {
        PyErr_Format(PyExc_ValueError, "data (%zd bytes) is not a whole number of %zd-byte pages",
                     data.len, page_bytes);
        goto done;
    }
    if (prior.len != 0 && prior.len != DIGEST_LEN) {
        PyErr_SetString(PyExc_ValueError, "prior must be empty or a 32-byte SHA-256 digest");
        goto done;
    }
    Py_ssize_t pages = data.len / page_bytes;
    out = PyBytes_FromStringAndSize(NULL, pages * DIGEST_LEN);
    if (out == NULL)
        goto done;
    unsigned char *digests = (unsigned char *)PyBytes_AS_STRING(out);
    const unsigned char *page = (const unsigned char *)data.buf;
    const unsigned char *prev = (const unsigned char *)prior.buf;
    size_t prev_len = (size_t)prior.len;
    ctx = EVP_MD_CTX_new();
    if (ctx == NULL) {
        PyErr_NoMemory();
        Py_CLEAR(out);
        goto done;
    }
    for (Py_ssize_t i = 0; i < pages; i++, page += page_bytes) {
        unsigned char *digest = digests + i * DIGEST_LEN;
        if (!EVP_DigestInit_ex(ctx, sha256_md, NULL)
            || (prev_len && !EVP_DigestUpdate(ctx, prev, prev_len))
            || !EVP_DigestUpdate(ctx, page, (size_t)page_bytes)
            || !EVP_DigestFinal_ex(ctx, digest, NULL)) {
            PyErr_SetString(PyExc_RuntimeError, "OpenSSL SHA-256 failed");
            Py_CLEAR(out);
            goto done;
        }
        prev = digest;
        prev_len = DIGEST_LEN;
    }
done:
    EVP_MD_CTX_free(ctx);
    PyBuffer_Release(&data);
    PyBuffer_Release(&prior);
    return out;
}

static PyMethodDef methods[] = {
    {"chain_digests", chain_digests, METH_VARARGS,
     "chain_digests(data, page_bytes, prior) -> bytes: the SHA-256 chain digests of the pages of "
     "data (32 bytes each, concatenated), continuing from prior (b'' or a 32-byte digest)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "radix_global._chainhash",
    "SHA-256 page chain of radix_global.keys, compiled (OpenSSL).", -1, methods,
};

PyMODINIT_FUNC PyInit__chainhash(void) {
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
#else
    sha256_md = (EVP_MD *)EVP_sha256();
#endif
    if (sha256_md == NULL) {
        PyErr_SetString(PyExc_ImportError, "OpenSSL has no SHA-256");
        return NULL;
    }
    return PyModule_Create(&module);
}
