/* An MPI job's usual traffic, every result checked: ping-pong between ranks 0 and 1,
 * allreduce, alltoall, and one-sided MPI_Put / MPI_Get in a window (fence epochs).
 * Prints "mpi_check: ok <ranks> ranks" on rank 0 when every check passed; exits 1 otherwise.
 * Optional arguments: bytes for the timed allreduce and ping-pong (default 1024), and how many
 * timed iterations of each (default 200). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "rank %d: check failed: ", rank);              \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
            MPI_Abort(MPI_COMM_WORLD, 1);                                  \
        }                                                                  \
    } while (0)

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t bytes = argc > 1 ? strtoul(argv[1], NULL, 0) : 1024;
    int n = (int)(bytes / sizeof(double));
    if (n < 1)
        n = 1;

    /* Ping-pong between 0 and 1, the data checked each way. */
    char *buf = malloc(bytes);
    const int iters = argc > 2 ? atoi(argv[2]) : 200;
    double t0 = 0;
    /* The first round warms up (connections, registration caches); the second is timed. */
    for (int i = 0; i < 2 * iters && size > 1; i++) {
        if (i == iters)
            t0 = MPI_Wtime();
        if (rank == 0) {
            memset(buf, i & 0xff, bytes);
            MPI_Send(buf, (int)bytes, MPI_CHAR, 1, 7, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)bytes, MPI_CHAR, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            CHECK((unsigned char)buf[bytes - 1] == ((i + 1) & 0xff), "pong %d", i);
        } else if (rank == 1) {
            MPI_Recv(buf, (int)bytes, MPI_CHAR, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            CHECK((unsigned char)buf[0] == (i & 0xff), "ping %d", i);
            memset(buf, (i + 1) & 0xff, bytes);
            MPI_Send(buf, (int)bytes, MPI_CHAR, 0, 7, MPI_COMM_WORLD);
        }
    }
    double pingpong_us = size > 1 ? (MPI_Wtime() - t0) * 1e6 / iters / 2 : 0;

    /* Allreduce: element j of rank r is r + j; the sum over ranks is known. */
    double *in = malloc(n * sizeof(double)), *out = malloc(n * sizeof(double));
    for (int j = 0; j < n; j++)
        in[j] = rank + j;
    MPI_Allreduce(in, out, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (int j = 0; j < n; j++)
        CHECK(out[j] == (double)size * (size - 1) / 2 + (double)size * j, "allreduce[%d]", j);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
        MPI_Allreduce(in, out, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double allreduce_us = (MPI_Wtime() - t0) * 1e6 / iters;

    /* Alltoall: rank r sends r * 1000 + d to rank d. */
    int *sendv = malloc(size * sizeof(int)), *recvv = malloc(size * sizeof(int));
    for (int d = 0; d < size; d++)
        sendv[d] = rank * 1000 + d;
    MPI_Alltoall(sendv, 1, MPI_INT, recvv, 1, MPI_INT, MPI_COMM_WORLD);
    for (int s = 0; s < size; s++)
        CHECK(recvv[s] == s * 1000 + rank, "alltoall from %d", s);

    /* One-sided: each rank puts its rank into slot `rank` of its right neighbour's window,
     * then reads back from the left neighbour's window what its own left neighbour put. */
    int *win_mem;
    MPI_Win win;
    MPI_Win_allocate(size * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &win_mem,
                     &win);
    for (int s = 0; s < size; s++)
        win_mem[s] = -1;
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    MPI_Win_fence(0, win);
    int mine = rank + 100;
    MPI_Put(&mine, 1, MPI_INT, right, rank, 1, MPI_INT, win);
    MPI_Win_fence(0, win);
    CHECK(win_mem[left] == left + 100, "put from %d: %d", left, win_mem[left]);
    /* The left neighbour's window holds, at slot `slot`, what its own left neighbour put. */
    int got = -1, slot = (left + size - 1) % size;
    MPI_Get(&got, 1, MPI_INT, left, slot, 1, MPI_INT, win);
    MPI_Win_fence(0, win);
    CHECK(got == slot + 100, "get from %d: %d", left, got);
    MPI_Win_free(&win);

    if (rank == 0)
        printf("mpi_check: ok %d ranks; %zu B: ping-pong half round trip %.2f us, "
               "allreduce %.2f us\n",
               size, bytes, pingpong_us, allreduce_us);
    free(buf);
    free(in);
    free(out);
    free(sendv);
    free(recvv);
    MPI_Finalize();
    return 0;
}
