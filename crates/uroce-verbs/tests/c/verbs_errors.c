/*
 * verbs_errors.c - error paths of the verbs ABI, checked against what a real RNIC reports.
 *
 * Written against rdma-core 44's <infiniband/verbs.h> and nothing else, so the same binary
 * runs on uroce's drop-in libibverbs.so.1 or on a hardware RNIC. It opens two devices (on uroce:
 * uroce0 = 127.0.0.2 and uroce1 = 127.0.0.3), connects fresh RC QP pairs between them for each
 * scenario, provokes one error, and checks the work completion status each side reports:
 *
 *   a. receive buffer too small: a 64-byte SEND into a 16-byte receive.
 *      Responder: IBV_WC_LOC_LEN_ERR on its receive WQE. A message longer than the receive
 *      buffers is an invalid request, so the responder NAKs with Invalid Request and the
 *      requester completes with IBV_WC_REM_INV_REQ_ERR (IBA vol. 1 §9.7.5.2 NAK codes,
 *      §9.9.3 responder errors). A completion in error leaves both QPs in the Error state.
 *   b. bad R_Key: an RDMA WRITE and, on another pair, an RDMA READ with a wrong R_Key.
 *      The responder's R_Key check fails; it NAKs with Remote Access Error, so the requester
 *      completes with IBV_WC_REM_ACCESS_ERR (§9.7.5.2). An access violation is a class C
 *      responder error (§9.9.3): the responder's QP enters Error too, and nothing is written.
 *   c. retry exhaustion: a QP connected to a QPN that does not exist on the peer. The peer
 *      silently drops packets for an unknown destination QP (§9.6, transport header
 *      validation), no ACK ever comes, and after retry_cnt expiries of the ACK timer
 *      (4.096 us * 2^timeout, §9.7) the requester completes with IBV_WC_RETRY_EXC_ERR.
 *   d. flush: a QP in the Error state completes every outstanding and every newly posted WR
 *      with IBV_WC_WR_FLUSH_ERR (§10.3, QP states; ibv_modify_qp(3)). Checked with three
 *      receives and a modify to IBV_QPS_ERR (flushed in posting order), and with sends posted
 *      on the requesters that a and b left in Error.
 *   e. synchronous failures: ibv_reg_mr with REMOTE_WRITE but not LOCAL_WRITE fails with
 *      EINVAL (ibv_reg_mr(3): remote write or atomic access requires local write);
 *      ibv_post_send on a QP in RESET fails with EINVAL (§10.3: the send queue takes WRs
 *      from RTS on); ibv_create_qp with IBV_QPT_XRC_SEND returns NULL on a device that does
 *      not advertise IBV_DEVICE_XRC (an XRC initiator QP needs only a PD, so a device with XRC,
 *      such as a ConnectX, may create it: then the check is skipped).
 *   f. completion channel (ibv_create_comp_channel(3), ibv_req_notify_cq(3),
 *      ibv_get_cq_event(3)): the channel's CQ is the receive side's (the responder's CQ, which
 *      takes its receive completions). Armed with ibv_req_notify_cq(cq, 0), the channel's fd
 *      stays unreadable (poll(2), 200 ms) while nothing completes; a SEND into a posted receive
 *      makes it readable, ibv_get_cq_event returns that CQ and its cq_context, and once the
 *      event is acked ibv_poll_cq returns the receive completion at once (the completion is in
 *      the CQ before its event). The event taken, the fd is unreadable again. With O_NONBLOCK
 *      on the fd, ibv_get_cq_event returns -1 with errno EAGAIN when no event is pending and the
 *      event when one is (re-armed, second SEND). ibv_destroy_comp_channel returns EBUSY while
 *      a CQ uses the channel, and 0 once that CQ is destroyed.
 *   g. asynchronous event (ibv_get_async_event(3), ibv_modify_srq(3), ibv_query_srq(3)): an
 *      SRQ (max_wr 16, max_sge 1) with 4 receives, armed with srq_limit 3, feeds the receiving
 *      QP of an RC pair; 2 SENDs leave 2 WRs in it, below the limit, so the responder's context
 *      reports IBV_EVENT_SRQ_LIMIT_REACHED for that SRQ: its async_fd turns readable (poll(2),
 *      5 s). Other events (IBV_EVENT_COMM_EST of f's or g's responder QP may or may not come)
 *      are acked and ignored. After the drain to EAGAIN the fd must not stay readable with no
 *      event to get (poll(2) then ibv_get_async_event, as ibv_get_async_event(3)'s non-blocking
 *      example does it). The limit disarms when it fires: ibv_query_srq then reports
 *      srq_limit 0 (ibv_query_srq(3): 0 means "not (or no longer) armed"). A second context
 *      opened on the same device gets none of it: its async_fd stays unreadable.
 *   i. destroy after an event (ibv_get_cq_event(3): every event returned must be acked, and
 *      ibv_destroy_cq waits for that, so that a thread handling an event never finds its CQ
 *      freed): a thread takes the event of a SEND's completion and acks it only 300 ms later;
 *      ibv_destroy_cq on that CQ, called meanwhile, returns no earlier than the ack. Likewise
 *      for asynchronous events (ibv_get_async_event(3): destroying a QP or an SRQ waits for
 *      the acks of its affiliated events): an SRQ armed with limit 3 and 4 receives feeds an
 *      RC QP; 2 SENDs make it report IBV_EVENT_SRQ_LIMIT_REACHED and the QP moved to Error
 *      reports IBV_EVENT_QP_LAST_WQE_REACHED (IBA 11.6.3: a QP on an SRQ that stops taking
 *      its WQEs). A thread takes both and holds them, acking the QP's 300 ms later and the
 *      SRQ's 300 ms after that; ibv_destroy_qp, then ibv_destroy_srq, called meanwhile,
 *      each return no earlier than its object's ack. (UCX's IB transport reads
 *      element.qp->qp_num of an event while its progress thread may destroy that QP.)
 *   j. memory unmapped after registration (ibv_reg_mr(3) pins it on a NIC; here it pins nothing,
 *      and a peer must still not be able to crash the process): the responder registers two
 *      pages of its own mapping and unmaps them; a peer's RDMA WRITE, RDMA READ, compare and
 *      swap and fetch and add into them (one fresh pair each) complete with
 *      IBV_WC_REM_ACCESS_ERR, the responder's QP is in Error and its context reports
 *      IBV_EVENT_QP_ACCESS_ERR for that QP (IBA §11.6.3.1, local access violation work queue
 *      error), the process goes on, and the region still deregisters.
 *   h. ABI details: ibv_query_port@IBVERBS_1.1 called directly writes 48 bytes, no more;
 *      ibv_query_device_ex answers; on uroce, ibv_create_qp_ex with the TSO send operation
 *      and ibv_reg_dmabuf_mr fail with EOPNOTSUPP (raw-packet offloads and dmabuf are out of
 *      uroce's scope).
 *   k. checks a device makes before it changes anything: ibv_modify_qp against the table of
 *      required and optional attributes per transition (IBA §11.2.5.2; Linux applies it to
 *      every device, ib_modify_qp_is_ok): an RTR attribute (DEST_QPN) at RESET->INIT, a mask
 *      bit no verbs.h defines (1 << 30), a source GID index past the port's table at
 *      INIT->RTR, a PATH_MTU at RTS->RTS and a cur_qp_state the QP is not in are refused
 *      (EINVAL; EOPNOTSUPP for the unknown bit), and the QP stays where it was; the right
 *      cur_qp_state is taken; an empty entry of the GID table reads ENODATA through
 *      ibv_query_gid_ex and the zero GID through ibv_query_gid, and is no source GID for a QP
 *      or an address handle. ibv_dealloc_pd returns EBUSY while an MR or a QP uses the PD
 *      (ibv_dealloc_pd(3)) and 0 once neither does. ibv_create_cq with comp_vector equal to
 *      the context's num_comp_vectors fails with EINVAL (ibv_create_cq(3): the vector is below
 *      num_comp_vectors). ibv_resize_cq grows and shrinks a CQ, keeping what it holds, and
 *      refuses a size below the completions queued (EINVAL). ibv_rereg_mr changes access,
 *      PD and translation, alone and together, in the same struct ibv_mr (no flags:
 *      IBV_REREG_MR_ERR_INPUT with EINVAL), and the PD it leaves can be deallocated while the
 *      one it joined cannot. ibv_query_device_ex comes from
 *      the provider, not the legacy fallback: phys_port_cnt_ex equals phys_port_cnt and the
 *      legacy part equals what ibv_query_device reports.
 *   l. the extended CQ, polled with ibv_start_poll/ibv_next_poll/ibv_end_poll and read with
 *      ibv_wc_read_*, its completion timestamps checked against ibv_query_rt_values_ex's
 *      clock (scenario_cq_ex).
 *   m. the extended QP's ibv_wr_* send API: one batch of six operations (IBA 1.5's atomic
 *      write among them), a batch refused whole, an aborted one (scenario_wr_api).
 *   n. memory windows of type 1 and 2: bind, access inside and past a window, remote
 *      invalidation, a bind that breaks a rule (scenario_mw).
 *   o. on-demand paging, explicit and implicit, and ibv_advise_mr (scenario_odp).
 *   p. thread and parent domains and their lifetimes (scenario_parent_domain).
 *   q. device memory, zero-based and IOVA regions (scenario_dm).
 *   r. XRC (IBA Annex A14; ibv_open_xrcd(3), ibv_create_srq_ex(3), ibv_open_qp(3)): a domain
 *      named by a file (none without O_CREAT, the same one again, none with O_EXCL), an XRC
 *      SRQ and its number, a target QP in the domain and an initiator on the other device; a
 *      SEND naming the SRQ completes on the SRQ's CQ with the target's QP number; a handle
 *      from ibv_open_qp outlives nothing (the target serves on after it is destroyed); the
 *      halves have no receive queue (ibv_post_recv fails); the domain's last close is EBUSY
 *      while its SRQ and target live; a SEND naming an SRQ the domain does not have completes
 *      with IBV_WC_REM_INV_REQ_ERR (scenario_xrc).
 *   s. import (ibv_import_device(3), ibv_import_pd(3), ibv_import_mr(3), ibv_import_dm(3)): a
 *      duplicate of a context's cmd_fd opens another context on its objects (a descriptor of
 *      another file imports nothing: EOPNOTSUPP on uroce, whose objects live in the process);
 *      its PD, region and device memory are found by their handles (an unknown one is EINVAL),
 *      the imported region has the original's keys, address and length, the imported device
 *      memory holds what the original's copy put there, and a QP made through the imported
 *      context and PD carries an RDMA WRITE; unimported and closed, the originals serve on
 *      (scenario_import).
 *   t. tag matching (rdma-core Documentation/tag_matching.md; ibv_create_srq_ex(3) with
 *      IBV_SRQT_TM, ibv_post_srq_ops(3)): a TM-SRQ needs its CQ (EINVAL without); an ADD
 *      completes IBV_WC_TM_ADD and hands back a handle; an eager message with a posted tag
 *      lands in the tag's buffer without its TMH (IBV_WC_TM_RECV, MATCH | DATA_VALID, its tag
 *      and context through ibv_wc_read_tm_info); one with another tag goes whole to an SRQ
 *      buffer as unexpected (no match flags), and a sync with the count completes
 *      IBV_WC_TM_SYNC without IBV_WC_TM_SYNC_REQ; NO_TAG completes IBV_WC_TM_NO_TAG; a
 *      rendezvous request is READ by the receiving device (MATCH, then DATA_VALID with the
 *      data), which SENDs the FIN back; DEL of a handle never added fails with EINVAL and
 *      names it in bad_op (scenario_tm).
 *
 * Section numbers are those of IBA vol. 1 (release 1.2.1 and later, chapters 9 "Transport
 * layer", 10 "Software transport interface"); compliance statement numbers (C9-nn) are not
 * quoted because they shift between releases.
 *
 * Each completion is printed as "scenario: side status_string (number)" with
 * ibv_wc_status_str, as it would read on hardware. Any unmet expectation prints "FAIL: ..."
 * and the program exits 1; it exits 0 only if every expectation holds.
 *
 * Build: gcc -Wall -Wextra -O2 -o /tmp/verbs_errors verbs_errors.c -libverbs
 * Run:   LD_LIBRARY_PATH=<dir with uroce's libibverbs.so.1> UROCE_ADDR=127.0.0.2,127.0.0.3 /tmp/verbs_errors
 * (tests/programs.rs builds and runs it).
 */

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <infiniband/tm_types.h>
#include <infiniband/verbs.h>

#define BUF_SIZE 4096
#define CQ_DEPTH 16
#define POLL_MS 5000        /* deadline for one completion */
#define RETRY_POLL_MS 10000 /* deadline for the retry-exhaustion scenario */
#define PORT 1
#define GID_INDEX 0

/* Every access right a responder may need: the MRs serve as local and as remote buffers. */
#define MR_ACCESS                                                                            \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |          \
	 IBV_ACCESS_REMOTE_ATOMIC)

static int failures;

/* Records an unmet expectation; the run goes on so one run reports every failure. */
static void fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf("FAIL: ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	fflush(stdout);
	failures++;
}

/* A failure of the setup the scenarios stand on: nothing sensible can follow. */
static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf("FAIL: setup: ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	exit(1);
}

/* One opened device: its context, a PD and its port-1 GID index 0. */
struct dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	union ibv_gid gid;
	const char *name;
};

/* One end of an RC connection: a QP with its own CQ (send and receive) and registered buffer. */
struct ep {
	struct dev *dev;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	uint32_t psn; /* first PSN this end sends */
};

static const char *state_str(enum ibv_qp_state s)
{
	static const char *const names[] = { "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR" };

	return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "UNKNOWN";
}

static void open_dev(struct dev *d, struct ibv_device *ibdev)
{
	struct ibv_port_attr port;

	d->name = ibv_get_device_name(ibdev);
	d->ctx = ibv_open_device(ibdev);
	if (!d->ctx)
		die("ibv_open_device(%s): %s", d->name, strerror(errno));
	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd)
		die("ibv_alloc_pd(%s): %s", d->name, strerror(errno));
	if (ibv_query_port(d->ctx, PORT, &port))
		die("ibv_query_port(%s)", d->name);
	if (port.state != IBV_PORT_ACTIVE)
		die("%s port %d is not active (state %d)", d->name, PORT, port.state);
	if (ibv_query_gid(d->ctx, PORT, GID_INDEX, &d->gid))
		die("ibv_query_gid(%s)", d->name);
}

static void close_dev(struct dev *d)
{
	if (ibv_dealloc_pd(d->pd))
		fail("cleanup: ibv_dealloc_pd(%s)", d->name);
	if (ibv_close_device(d->ctx))
		fail("cleanup: ibv_close_device(%s)", d->name);
}

static void ep_attach(struct ep *e, struct dev *d, struct ibv_srq *srq);

/*
 * A fresh RC QP in RESET, with its CQ and a zeroed, registered buffer. The CQ reports to
 * `channel` with `cq_context` (NULL, NULL: no channel); with an `srq` the QP takes its receives
 * from it and has no receive queue of its own.
 */
static void ep_create_ex(struct ep *e, struct dev *d, struct ibv_comp_channel *channel,
			 void *cq_context, struct ibv_srq *srq)
{
	memset(e, 0, sizeof(*e));
	e->cq = ibv_create_cq(d->ctx, CQ_DEPTH, cq_context, channel, 0);
	if (!e->cq)
		die("ibv_create_cq(%s): %s", d->name, strerror(errno));
	ep_attach(e, d, srq);
}

/* The QP, MR and buffer of an end whose CQ (e->cq, set by the caller) already exists. */
static void ep_attach(struct ep *e, struct dev *d, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.srq = srq,
		.cap = { .max_send_wr = 8, .max_recv_wr = srq ? 0 : 8, .max_send_sge = 1,
			 .max_recv_sge = srq ? 0 : 1 },
	};

	e->dev = d;
	e->buf = aligned_alloc(4096, BUF_SIZE);
	if (!e->buf)
		die("aligned_alloc");
	memset(e->buf, 0, BUF_SIZE);
	e->mr = ibv_reg_mr(d->pd, e->buf, BUF_SIZE, MR_ACCESS);
	if (!e->mr)
		die("ibv_reg_mr(%s): %s", d->name, strerror(errno));
	init.send_cq = e->cq;
	init.recv_cq = e->cq;
	e->qp = ibv_create_qp(d->pd, &init);
	if (!e->qp)
		die("ibv_create_qp(%s): %s", d->name, strerror(errno));
	/* Any start PSN works; a QP-dependent one makes mismatches show up. */
	e->psn = (e->qp->qp_num * 2654435761u) & 0xffffff;
}

/* A fresh RC QP in RESET with its own CQ (no channel) and receive queue. */
static void ep_create(struct ep *e, struct dev *d)
{
	ep_create_ex(e, d, NULL, NULL, NULL);
}

static void ep_destroy(struct ep *e)
{
	if (ibv_destroy_qp(e->qp))
		fail("cleanup: ibv_destroy_qp(%s qp 0x%06x)", e->dev->name, e->qp->qp_num);
	if (ibv_destroy_cq(e->cq))
		fail("cleanup: ibv_destroy_cq(%s)", e->dev->name);
	if (ibv_dereg_mr(e->mr))
		fail("cleanup: ibv_dereg_mr(%s)", e->dev->name);
	free(e->buf);
}

/*
 * RESET -> INIT -> RTR -> RTS towards (dgid, dest_qpn), expecting the peer to start at
 * dest_psn. timeout and retry_cnt are the requester's ACK timer and transport retry count.
 */
static void connect_qp(struct ep *e, const union ibv_gid *dgid, uint32_t dest_qpn,
		       uint32_t dest_psn, uint8_t timeout, uint8_t retry_cnt)
{
	struct ibv_qp_attr a;
	int rc;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = PORT;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			    IBV_ACCESS_REMOTE_ATOMIC;
	rc = ibv_modify_qp(e->qp, &a,
			   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (rc)
		die("modify_qp INIT (%s): %s", e->dev->name, strerror(rc));

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = dest_psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *dgid;
	a.ah_attr.grh.sgid_index = GID_INDEX;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = PORT;
	rc = ibv_modify_qp(e->qp, &a,
			   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				   IBV_QP_MIN_RNR_TIMER);
	if (rc)
		die("modify_qp RTR (%s): %s", e->dev->name, strerror(rc));

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = e->psn;
	a.timeout = timeout;
	a.retry_cnt = retry_cnt;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	rc = ibv_modify_qp(e->qp, &a,
			   IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				   IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
	if (rc)
		die("modify_qp RTS (%s): %s", e->dev->name, strerror(rc));
}

/* Connects a and b to each other with the usual attributes. */
static void connect_pair(struct ep *a, struct ep *b)
{
	connect_qp(a, &b->dev->gid, b->qp->qp_num, b->psn, 14, 7);
	connect_qp(b, &a->dev->gid, a->qp->qp_num, a->psn, 14, 7);
}

/* A fresh pair: a on device da (the requester), b on device db (the responder). */
static void make_pair(struct ep *a, struct dev *da, struct ep *b, struct dev *db)
{
	ep_create(a, da);
	ep_create(b, db);
	connect_pair(a, b);
}

static long elapsed_ms(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (now.tv_sec - t0->tv_sec) * 1000L + (now.tv_nsec - t0->tv_nsec) / 1000000L;
}

/* Busy-polls cq for one completion: 1 when *wc holds one, 0 on timeout, -1 on a poll error. */
static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc, long timeout_ms)
{
	struct timespec t0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);

		if (n < 0)
			return -1;
		if (n == 1)
			return 1;
		if (elapsed_ms(&t0) > timeout_ms)
			return 0;
	}
}

/*
 * Waits for the next completion on e's CQ and checks it: status, wr_id and qp_num (the fields
 * ibv_poll_cq(3) defines for every status). Prints "scenario: side status (n)". Returns the
 * status seen, or -1 when none came.
 */
static int expect_wc(const char *scenario, const char *side, struct ep *e, uint64_t wr_id,
		     enum ibv_wc_status want, long timeout_ms)
{
	struct ibv_wc wc;
	int n;

	memset(&wc, 0, sizeof(wc));
	n = poll_one(e->cq, &wc, timeout_ms);
	if (n < 0) {
		fail("%s: %s: ibv_poll_cq failed", scenario, side);
		return -1;
	}
	if (n == 0) {
		fail("%s: %s: no completion within %ld ms (expected %s)", scenario, side,
		     timeout_ms, ibv_wc_status_str(want));
		return -1;
	}
	printf("%s: %s %s (%d)\n", scenario, side, ibv_wc_status_str(wc.status), wc.status);
	fflush(stdout);
	if (wc.status != want)
		fail("%s: %s: status %s (%d), expected %s (%d)", scenario, side,
		     ibv_wc_status_str(wc.status), wc.status, ibv_wc_status_str(want), want);
	if (wc.wr_id != wr_id)
		fail("%s: %s: wr_id 0x%" PRIx64 ", expected 0x%" PRIx64, scenario, side,
		     (uint64_t)wc.wr_id, wr_id);
	if (wc.qp_num != e->qp->qp_num)
		fail("%s: %s: qp_num 0x%06x, expected 0x%06x", scenario, side, wc.qp_num,
		     e->qp->qp_num);
	return wc.status;
}

/* Checks that e's CQ stays empty for a while: no duplicate or stray completions. */
static void expect_no_wc(const char *scenario, const char *side, struct ep *e)
{
	struct ibv_wc wc;

	if (poll_one(e->cq, &wc, 200) != 0)
		fail("%s: %s: unexpected extra completion (wr_id 0x%" PRIx64 ", %s)", scenario,
		     side, (uint64_t)wc.wr_id, ibv_wc_status_str(wc.status));
}

/* Checks the QP state as ibv_query_qp reports it. */
static void expect_state(const char *scenario, const char *side, struct ep *e,
			 enum ibv_qp_state want)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;
	int rc = ibv_query_qp(e->qp, &a, IBV_QP_STATE, &i);

	if (rc) {
		fail("%s: %s: ibv_query_qp: %s", scenario, side, strerror(rc));
		return;
	}
	printf("%s: %s QP state %s\n", scenario, side, state_str(a.qp_state));
	if (a.qp_state != want)
		fail("%s: %s: QP state %s, expected %s", scenario, side, state_str(a.qp_state),
		     state_str(want));
}

static int post_recv(struct ep *e, uint64_t wr_id, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)e->buf, .length = len, .lkey = e->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad = NULL;

	return ibv_post_recv(e->qp, &wr, &bad);
}

/* Posts one signaled WR of `len` bytes from e's buffer; raddr/rkey are used by RDMA opcodes. */
static int post_send(struct ep *e, enum ibv_wr_opcode op, uint64_t wr_id, uint32_t len,
		     uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)e->buf, .length = len, .lkey = e->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
	};
	struct ibv_send_wr *bad = NULL;

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(e->qp, &wr, &bad);
}

/* Posts a WR that must be accepted; a refusal is recorded as a failure. */
static int must_post(const char *scenario, const char *what, int rc)
{
	if (rc)
		fail("%s: %s refused: %s (%d)", scenario, what, strerror(rc), rc);
	return rc == 0;
}

/* poll(2) for POLLIN on fd: 1 readable, 0 not readable within timeout_ms, -1 on an error. */
static int fd_readable(int fd, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int n;

	do
		n = poll(&p, 1, timeout_ms);
	while (n < 0 && errno == EINTR);
	if (n < 0 || (p.revents & (POLLERR | POLLNVAL)))
		return -1;
	return n > 0 && (p.revents & POLLIN);
}

static const char *readable_str(int r)
{
	return r > 0 ? "readable" : r == 0 ? "not readable" : "poll error";
}

/* Adds O_NONBLOCK to fd's file status flags (then waiting verbs on it return EAGAIN). */
static void set_nonblocking(int fd, const char *what)
{
	int flags = fcntl(fd, F_GETFL);

	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
		die("fcntl(%s, O_NONBLOCK): %s", what, strerror(errno));
}

/*
 * d (second half). The QP in e is in the Error state: a newly posted send must be accepted and
 * complete with IBV_WC_WR_FLUSH_ERR (IBA §10.3: in Error, WRs are completed in error, flushed).
 */
static void expect_flush_after_error(const char *scenario, struct ep *e, uint64_t wr_id)
{
	if (must_post(scenario, "send on the QP in Error",
		      post_send(e, IBV_WR_SEND, wr_id, 8, 0, 0)))
		expect_wc(scenario, "sender (posted in Error)", e, wr_id, IBV_WC_WR_FLUSH_ERR,
			  POLL_MS);
}

/* a. A 64-byte SEND into a 16-byte receive. */
static void scenario_recv_too_small(struct dev *d0, struct dev *d1)
{
	const char *s = "receive buffer too small";
	struct ep snd, rcv;

	make_pair(&snd, d0, &rcv, d1);
	if (must_post(s, "16-byte receive", post_recv(&rcv, 0xa1, 16)) &&
	    must_post(s, "64-byte send", post_send(&snd, IBV_WR_SEND, 0xa2, 64, 0, 0))) {
		/* Responder: the message does not fit: local length error on the receive WQE. */
		expect_wc(s, "receiver", &rcv, 0xa1, IBV_WC_LOC_LEN_ERR, POLL_MS);
		/* Requester: NAK Invalid Request -> remote invalid request error. */
		expect_wc(s, "sender", &snd, 0xa2, IBV_WC_REM_INV_REQ_ERR, POLL_MS);
		/* A completion in error puts the QP in the Error state, on both sides. */
		expect_state(s, "sender", &snd, IBV_QPS_ERR);
		expect_state(s, "receiver", &rcv, IBV_QPS_ERR);
		expect_flush_after_error(s, &snd, 0xa3);
		expect_no_wc(s, "sender", &snd);
		expect_no_wc(s, "receiver", &rcv);
	}
	ep_destroy(&snd);
	ep_destroy(&rcv);
}

/* b. RDMA WRITE and RDMA READ with a wrong R_Key, each on its own pair. */
static void scenario_bad_rkey(struct dev *d0, struct dev *d1)
{
	const char *s = "bad rkey";
	struct ep req, rsp;
	uint32_t bad;

	/* RDMA WRITE. */
	make_pair(&req, d0, &rsp, d1);
	bad = rsp.mr->rkey ^ 0x1000;
	memset(req.buf, 0x5a, 64);
	if (must_post(s, "RDMA WRITE",
		      post_send(&req, IBV_WR_RDMA_WRITE, 0xb1, 64, (uintptr_t)rsp.buf, bad))) {
		expect_wc(s, "sender (RDMA WRITE)", &req, 0xb1, IBV_WC_REM_ACCESS_ERR, POLL_MS);
		expect_state(s, "sender (RDMA WRITE)", &req, IBV_QPS_ERR);
		/* A remote access violation is a class C responder error: the responder's QP
		 * goes to Error as well (IBA §9.9.3). */
		expect_state(s, "responder (RDMA WRITE)", &rsp, IBV_QPS_ERR);
		expect_flush_after_error(s, &req, 0xb2);
		expect_no_wc(s, "sender (RDMA WRITE)", &req);
		/* The access was refused: not one byte may have landed in the target buffer. */
		for (int i = 0; i < 64; i++) {
			if (rsp.buf[i] != 0) {
				fail("%s: RDMA WRITE with a bad rkey modified the target buffer", s);
				break;
			}
		}
	}
	ep_destroy(&req);
	ep_destroy(&rsp);

	/* RDMA READ. */
	make_pair(&req, d0, &rsp, d1);
	bad = rsp.mr->rkey ^ 0x1000;
	if (must_post(s, "RDMA READ",
		      post_send(&req, IBV_WR_RDMA_READ, 0xb3, 64, (uintptr_t)rsp.buf, bad))) {
		expect_wc(s, "sender (RDMA READ)", &req, 0xb3, IBV_WC_REM_ACCESS_ERR, POLL_MS);
		expect_state(s, "sender (RDMA READ)", &req, IBV_QPS_ERR);
		expect_state(s, "responder (RDMA READ)", &rsp, IBV_QPS_ERR);
		expect_no_wc(s, "sender (RDMA READ)", &req);
	}
	ep_destroy(&req);
	ep_destroy(&rsp);
}

/* c. A QP connected to a QPN that does not exist on the peer device. */
static void scenario_retry_exhaustion(struct dev *d0, struct dev *d1)
{
	const char *s = "retry exhaustion";
	struct ep req, peer;
	uint32_t ghost;

	ep_create(&req, d0);
	ep_create(&peer, d1); /* only to learn a real QPN of d1; stays in RESET */
	ghost = (peer.qp->qp_num ^ 0x5a5a) & 0xffffff;
	/* timeout 1 (8.192 us ACK timer), retry_cnt 1: two transmissions, then the error. */
	connect_qp(&req, &d1->gid, ghost, 0, 1, 1);
	if (must_post(s, "SEND", post_send(&req, IBV_WR_SEND, 0xc1, 32, 0, 0))) {
		expect_wc(s, "sender", &req, 0xc1, IBV_WC_RETRY_EXC_ERR, RETRY_POLL_MS);
		expect_state(s, "sender", &req, IBV_QPS_ERR);
		expect_no_wc(s, "sender", &req);
	}
	ep_destroy(&req);
	ep_destroy(&peer);
}

/* d. Three receives outstanding, then the QP is moved to Error: three flushes, in order. */
static void scenario_flush(struct dev *d0, struct dev *d1)
{
	const char *s = "flush";
	struct ep a, b;
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_ERR };
	int rc, posted = 0;

	make_pair(&a, d0, &b, d1);
	for (uint64_t i = 0; i < 3; i++)
		posted += must_post(s, "receive", post_recv(&b, 0xd1 + i, 64));
	rc = ibv_modify_qp(b.qp, &attr, IBV_QP_STATE);
	if (rc)
		fail("%s: ibv_modify_qp to IBV_QPS_ERR: %s (%d)", s, strerror(rc), rc);
	/* Completions of one work queue come back in the order the WRs were posted. */
	for (int i = 0; i < posted; i++)
		expect_wc(s, "receiver", &b, 0xd1 + (uint64_t)i, IBV_WC_WR_FLUSH_ERR, POLL_MS);
	expect_no_wc(s, "receiver", &b);
	expect_state(s, "receiver", &b, IBV_QPS_ERR);
	ep_destroy(&a);
	ep_destroy(&b);
}

/* e. Verbs that must fail synchronously. */
static void scenario_sync_failures(struct dev *d0)
{
	const char *s = "synchronous errors";
	struct ibv_device_attr dattr;
	struct ibv_qp_init_attr init;
	struct ibv_mr *mr;
	struct ibv_qp *qp;
	struct ep e;
	char *buf;
	int rc;

	/* ibv_reg_mr(3): REMOTE_WRITE (or REMOTE_ATOMIC) without LOCAL_WRITE is EINVAL. */
	buf = aligned_alloc(4096, BUF_SIZE);
	if (!buf)
		die("aligned_alloc");
	errno = 0;
	mr = ibv_reg_mr(d0->pd, buf, BUF_SIZE, IBV_ACCESS_REMOTE_WRITE);
	printf("%s: ibv_reg_mr(REMOTE_WRITE without LOCAL_WRITE) -> %s, errno %s (%d)\n", s,
	       mr ? "MR" : "NULL", strerror(errno), errno);
	if (mr) {
		fail("%s: ibv_reg_mr accepted REMOTE_WRITE without LOCAL_WRITE", s);
		ibv_dereg_mr(mr);
	} else if (errno != EINVAL) {
		fail("%s: ibv_reg_mr: errno %d, expected EINVAL (%d)", s, errno, EINVAL);
	}
	/*
	 * A device pins the pages it registers: memory that is not there is EFAULT (a range
	 * that wraps, EINVAL), and read-only memory cannot be registered for writing. The
	 * device reports a max_mr_size it can honour.
	 */
	{
		const struct {
			const char *what;
			void *addr;
			size_t len;
			int access;
			int errno_wanted;
		} bad[] = {
			{ "4 KiB buffer, 1 TiB", buf, (size_t)1 << 40, IBV_ACCESS_LOCAL_WRITE, EFAULT },
			{ "buffer, SIZE_MAX", buf, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE, EINVAL },
			{ "(void *)0x1000, 4096", (void *)0x1000, 4096, 0, EFAULT },
			{ "code, LOCAL_WRITE", (void *)scenario_sync_failures, 64,
			  IBV_ACCESS_LOCAL_WRITE, EFAULT },
		};
		for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
			errno = 0;
			mr = ibv_reg_mr(d0->pd, bad[k].addr, bad[k].len, bad[k].access);
			printf("%s: ibv_reg_mr(%s) -> %s, errno %s (%d)\n", s, bad[k].what,
			       mr ? "MR" : "NULL", strerror(errno), errno);
			if (mr) {
				fail("%s: ibv_reg_mr(%s) was accepted", s, bad[k].what);
				ibv_dereg_mr(mr);
			} else if (errno != bad[k].errno_wanted) {
				fail("%s: ibv_reg_mr(%s): errno %d, expected %d", s, bad[k].what,
				     errno, bad[k].errno_wanted);
			}
		}
		/* Read-only memory registered for reading only is fine. */
		mr = ibv_reg_mr(d0->pd, (void *)scenario_sync_failures, 64, 0);
		if (!mr)
			fail("%s: ibv_reg_mr(code, read only): %s", s, strerror(errno));
		else
			ibv_dereg_mr(mr);
		if (ibv_query_device(d0->ctx, &dattr))
			die("ibv_query_device(%s)", d0->name);
		printf("%s: max_mr_size %#" PRIx64 "\n", s, (uint64_t)dattr.max_mr_size);
		if (dattr.max_mr_size == UINT64_MAX && strncmp(d0->name, "uroce", 5) == 0)
			fail("%s: max_mr_size 2^64-1 is more than any address space", s);
	}
	free(buf);

	/* ibv_post_send(3) on a QP still in RESET: refused, EINVAL. */
	ep_create(&e, d0);
	rc = post_send(&e, IBV_WR_SEND, 0xe1, 8, 0, 0);
	printf("%s: ibv_post_send on a QP in RESET -> %d (%s)\n", s, rc,
	       rc ? strerror(rc) : "accepted");
	if (rc == 0)
		fail("%s: ibv_post_send on a QP in RESET was accepted", s);
	else if (rc != EINVAL)
		fail("%s: ibv_post_send on a QP in RESET: %d, expected EINVAL (%d)", s, rc, EINVAL);
	expect_no_wc(s, "RESET QP", &e);
	/* ibv_destroy_cq(3): EBUSY while a QP still uses the CQ (it stays usable). */
	rc = ibv_destroy_cq(e.cq);
	printf("%s: ibv_destroy_cq while its QP exists -> %d (%s)\n", s, rc,
	       rc ? strerror(rc) : "destroyed");
	if (rc != EBUSY)
		fail("%s: ibv_destroy_cq with a QP on it: %d, expected EBUSY (%d)", s, rc, EBUSY);
	ep_destroy(&e);

	/* ibv_create_qp(3) with an XRC send QP type on a device without XRC: NULL. */
	if (ibv_query_device(d0->ctx, &dattr))
		die("ibv_query_device(%s)", d0->name);
	ep_create(&e, d0); /* for a CQ */
	memset(&init, 0, sizeof(init));
	init.qp_type = IBV_QPT_XRC_SEND;
	init.send_cq = e.cq;
	init.recv_cq = e.cq;
	init.cap.max_send_wr = 1;
	init.cap.max_send_sge = 1;
	errno = 0;
	qp = ibv_create_qp(d0->pd, &init);
	printf("%s: ibv_create_qp(IBV_QPT_XRC_SEND) -> %s, errno %s (%d)\n", s, qp ? "QP" : "NULL",
	       strerror(errno), errno);
	if (dattr.device_cap_flags & IBV_DEVICE_XRC)
		printf("%s: %s supports XRC: XRC_SEND QP creation not checked\n", s, d0->name);
	else if (qp)
		fail("%s: ibv_create_qp(IBV_QPT_XRC_SEND) returned a QP on a device without XRC", s);
	if (qp)
		ibv_destroy_qp(qp);
	ep_destroy(&e);
}

/*
 * h. ABI details a drop-in library must get right:
 *  - ibv_query_port@IBVERBS_1.1, called as the exported function (not the header's inline
 *    wrapper, which goes through verbs_context.query_port with the caller's size), writes the
 *    48-byte struct _compat_ibv_port_attr and not one byte more;
 *  - verbs a device does not offer fail as the header's wrappers document: NULL with errno
 *    EOPNOTSUPP (checked on uroce only: hardware may have memory windows, XRC and dmabuf);
 *  - ibv_query_device_ex answers with the legacy attributes (section k checks it is the
 *    provider that answers, not the header's fallback to ibv_query_device).
 */
static void scenario_abi(struct dev *d0)
{
	const char *s = "abi";
	unsigned char raw[64];
	struct ibv_device_attr_ex ex;
	struct ibv_qp_init_attr_ex qpx;
	struct ep e;
	int rc, is_uroce = !strncmp(d0->name, "uroce", 5);

	memset(raw, 0xa5, sizeof(raw));
	rc = (ibv_query_port)(d0->ctx, 1, (struct _compat_ibv_port_attr *)raw);
	{
		struct ibv_port_attr pa;
		int untouched = 1;

		memcpy(&pa, raw, 48);
		for (size_t i = 48; i < sizeof(raw); i++)
			untouched &= raw[i] == 0xa5;
		printf("%s: ibv_query_port@IBVERBS_1.1 -> %d, state %s, bytes past 48 %s\n", s, rc,
		       ibv_port_state_str(pa.state), untouched ? "untouched" : "WRITTEN");
		if (rc || pa.state != IBV_PORT_ACTIVE)
			fail("%s: ibv_query_port (compat): rc %d state %d", s, rc, pa.state);
		if (!untouched)
			fail("%s: ibv_query_port (compat) wrote past the 48-byte compat struct", s);
	}

	memset(&ex, 0, sizeof(ex));
	rc = ibv_query_device_ex(d0->ctx, NULL, &ex);
	printf("%s: ibv_query_device_ex -> %d, max_qp_rd_atom %d, atomic_cap %d\n", s, rc,
	       ex.orig_attr.max_qp_rd_atom, ex.orig_attr.atomic_cap);
	if (rc || ex.orig_attr.max_qp_rd_atom <= 0 || ex.orig_attr.atomic_cap == IBV_ATOMIC_NONE)
		fail("%s: ibv_query_device_ex: rc %d, rd_atom %d, atomic_cap %d", s, rc,
		     ex.orig_attr.max_qp_rd_atom, ex.orig_attr.atomic_cap);

	if (!is_uroce) {
		printf("%s: %s is not uroce: unsupported-verb checks skipped\n", s, d0->name);
		return;
	}
	ep_create(&e, d0); /* for a CQ */
	memset(&qpx, 0, sizeof(qpx));
	qpx.qp_type = IBV_QPT_RC;
	qpx.send_cq = e.cq;
	qpx.recv_cq = e.cq;
	qpx.cap.max_send_wr = 1;
	qpx.cap.max_recv_wr = 1;
	qpx.cap.max_send_sge = 1;
	qpx.cap.max_recv_sge = 1;
	qpx.comp_mask = IBV_QP_INIT_ATTR_PD;
	qpx.pd = d0->pd;
	{
		/* With only a PD, the header's wrapper falls back to ibv_create_qp. */
		struct ibv_qp *qp = ibv_create_qp_ex(d0->ctx, &qpx);

		printf("%s: ibv_create_qp_ex(PD only) -> %s\n", s, qp ? "QP (the legacy verb)" : "NULL");
		if (!qp)
			fail("%s: ibv_create_qp_ex(PD only) failed: %s", s, strerror(errno));
		else if (ibv_destroy_qp(qp))
			fail("%s: ibv_destroy_qp", s);
	}
	/* Create flags, none set, take the provider's extended verb: a QP as the legacy one. */
	qpx.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
	qpx.create_flags = 0;
	{
		struct ibv_qp *qp = ibv_create_qp_ex(d0->ctx, &qpx);

		printf("%s: ibv_create_qp_ex(PD, create_flags 0) -> %s\n", s, qp ? "QP" : "NULL");
		if (!qp)
			fail("%s: ibv_create_qp_ex(PD, create_flags 0) failed: %s", s, strerror(errno));
		else if (ibv_destroy_qp(qp))
			fail("%s: ibv_destroy_qp", s);
		/* A create flag uroce does not offer is EOPNOTSUPP. */
		qpx.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
		errno = 0;
		qp = ibv_create_qp_ex(d0->ctx, &qpx);
		printf("%s: ibv_create_qp_ex(BLOCK_SELF_MCAST_LB) -> %s, errno %s\n", s,
		       qp ? "QP" : "NULL", strerror(errno));
		if (qp || errno != EOPNOTSUPP)
			fail("%s: ibv_create_qp_ex(BLOCK_SELF_MCAST_LB): expected EOPNOTSUPP", s);
		qpx.create_flags = 0;
	}
	/* A send operation uroce lacks (TSO, a raw-packet offload) fails the creation. */
	qpx.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qpx.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_TSO;
	{
		struct {
			const char *what;
			void *obj;
			int err;
		} r[2];

		errno = 0;
		r[0].what = "ibv_create_qp_ex(send_ops_flags TSO)";
		r[0].obj = ibv_create_qp_ex(d0->ctx, &qpx);
		r[0].err = errno;
		errno = 0;
		r[1].what = "ibv_reg_dmabuf_mr";
		r[1].obj = ibv_reg_dmabuf_mr(d0->pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE);
		r[1].err = errno;
		for (int i = 0; i < 2; i++) {
			printf("%s: %s -> %s, errno %s (%d)\n", s, r[i].what, r[i].obj ? "object" : "NULL",
			       strerror(r[i].err), r[i].err);
			if (r[i].obj || r[i].err != EOPNOTSUPP)
				fail("%s: %s: expected NULL with EOPNOTSUPP", s, r[i].what);
		}
	}
	ep_destroy(&e);
}

/* The cq_context of scenario f's CQ: an address ibv_get_cq_event must hand back. */
static int comp_cq_tag;

/*
 * f (part). The channel's fd turns readable within POLL_MS; ibv_get_cq_event then returns e's
 * CQ and comp_cq_tag; the event is acked. Returns 1 when an event was taken (so the
 * completion must already be in the CQ), else 0.
 */
static int expect_cq_event(const char *scenario, const char *when, struct ibv_comp_channel *ch,
			   struct ep *e)
{
	struct ibv_cq *ev_cq = NULL;
	void *ev_ctx = NULL;
	int r = fd_readable(ch->fd, POLL_MS);

	printf("%s: channel fd %s: %s\n", scenario, when, readable_str(r));
	if (r <= 0) {
		/* Not readable: a blocking ibv_get_cq_event could hang, so it is not called. */
		fail("%s: channel fd %s: %s within %d ms, expected readable", scenario, when,
		     readable_str(r), POLL_MS);
		return 0;
	}
	errno = 0;
	if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx)) {
		fail("%s: ibv_get_cq_event %s: -1, errno %s (%d)", scenario, when, strerror(errno),
		     errno);
		return 0;
	}
	printf("%s: ibv_get_cq_event %s -> %s CQ, %s cq_context\n", scenario, when,
	       ev_cq == e->cq ? "the receiver's" : "another",
	       ev_ctx == &comp_cq_tag ? "its" : "another");
	if (ev_cq != e->cq)
		fail("%s: ibv_get_cq_event %s returned CQ %p, expected the receiver's %p", scenario,
		     when, (void *)ev_cq, (void *)e->cq);
	if (ev_ctx != &comp_cq_tag)
		fail("%s: ibv_get_cq_event %s returned cq_context %p, expected %p", scenario, when,
		     ev_ctx, (void *)&comp_cq_tag);
	/* Every event taken is acked (ibv_destroy_cq waits for that on rdma-core). */
	if (ev_cq)
		ibv_ack_cq_events(ev_cq, 1);
	return 1;
}

/*
 * f. A CQ bound to a completion channel. The channel's CQ is the receive side's: the receiver's
 * one CQ, which takes the receive completion of the SEND (the sender polls its own CQ).
 */
static void scenario_comp_channel(struct dev *d0, struct dev *d1)
{
	const char *s = "completion channel";
	struct ibv_comp_channel *ch;
	struct ibv_cq *ev_cq = NULL;
	void *ev_ctx = NULL;
	struct ep snd, rcv;
	int rc, r, got;

	ch = ibv_create_comp_channel(d1->ctx);
	if (!ch)
		die("ibv_create_comp_channel(%s): %s", d1->name, strerror(errno));
	ep_create(&snd, d0);
	ep_create_ex(&rcv, d1, ch, &comp_cq_tag, NULL);
	connect_pair(&snd, &rcv);

	/* Armed for the next completion of any kind (solicited_only 0). */
	rc = ibv_req_notify_cq(rcv.cq, 0);
	if (rc)
		fail("%s: ibv_req_notify_cq: %s (%d)", s, strerror(rc), rc);
	/* Nothing has completed: no event, the fd stays unreadable. */
	r = fd_readable(ch->fd, 200);
	printf("%s: channel fd while nothing completes: %s\n", s, readable_str(r));
	if (r != 0)
		fail("%s: channel fd %s with nothing completed, expected not readable (200 ms)", s,
		     readable_str(r));

	if (must_post(s, "receive", post_recv(&rcv, 0xf1, 64)) &&
	    must_post(s, "SEND", post_send(&snd, IBV_WR_SEND, 0xf2, 32, 0, 0))) {
		got = expect_cq_event(s, "after the SEND", ch, &rcv);
		/* The event follows the completion into the CQ: once it is taken, the completion
		 * must be there at once (timeout 0: polls within the same millisecond). */
		expect_wc(s, "receiver", &rcv, 0xf1, IBV_WC_SUCCESS, got ? 0 : POLL_MS);
		expect_wc(s, "sender", &snd, 0xf2, IBV_WC_SUCCESS, POLL_MS);
		/* The one event was taken and the CQ is not re-armed: nothing left to read. */
		r = fd_readable(ch->fd, 0);
		printf("%s: channel fd after the event was taken: %s\n", s, readable_str(r));
		if (r != 0)
			fail("%s: channel fd %s after its only event was taken, expected not "
			     "readable", s, readable_str(r));
	}

	/* Non-blocking mode (ibv_get_cq_event(3)): O_NONBLOCK on the channel's fd. */
	set_nonblocking(ch->fd, "channel fd");
	errno = 0;
	rc = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
	printf("%s: non-blocking ibv_get_cq_event with no event pending -> %d, errno %s (%d)\n", s,
	       rc, strerror(errno), errno);
	if (rc == 0) {
		fail("%s: non-blocking ibv_get_cq_event returned an event, none was pending", s);
		ibv_ack_cq_events(ev_cq, 1);
	} else if (rc != -1 || errno != EAGAIN) {
		fail("%s: non-blocking ibv_get_cq_event: %d, errno %d, expected -1, EAGAIN (%d)", s,
		     rc, errno, EAGAIN);
	}
	/* ... and still returns an event when one is pending. */
	rc = ibv_req_notify_cq(rcv.cq, 0);
	if (rc)
		fail("%s: ibv_req_notify_cq (re-arm): %s (%d)", s, strerror(rc), rc);
	if (must_post(s, "receive", post_recv(&rcv, 0xf3, 64)) &&
	    must_post(s, "SEND", post_send(&snd, IBV_WR_SEND, 0xf4, 32, 0, 0))) {
		got = expect_cq_event(s, "after the second SEND (non-blocking)", ch, &rcv);
		expect_wc(s, "receiver", &rcv, 0xf3, IBV_WC_SUCCESS, got ? 0 : POLL_MS);
		expect_wc(s, "sender", &snd, 0xf4, IBV_WC_SUCCESS, POLL_MS);
	}
	expect_no_wc(s, "receiver", &rcv);
	expect_no_wc(s, "sender", &snd);

	/* ibv_create_comp_channel(3): destroying a channel a CQ still uses fails (EBUSY). */
	rc = ibv_destroy_comp_channel(ch);
	printf("%s: ibv_destroy_comp_channel with a CQ on it -> %d (%s)\n", s, rc,
	       rc ? strerror(rc) : "destroyed");
	if (rc == 0) {
		fail("%s: ibv_destroy_comp_channel succeeded while a CQ uses the channel", s);
		ch = NULL; /* gone: the CQ's destruction below may touch freed memory */
	} else if (rc != EBUSY) {
		fail("%s: ibv_destroy_comp_channel with a CQ on it: %d, expected EBUSY (%d)", s, rc,
		     EBUSY);
	}
	ep_destroy(&snd);
	ep_destroy(&rcv);
	if (ch) {
		rc = ibv_destroy_comp_channel(ch);
		printf("%s: ibv_destroy_comp_channel once its CQ is destroyed -> %d (%s)\n", s, rc,
		       rc ? strerror(rc) : "destroyed");
		if (rc)
			fail("%s: ibv_destroy_comp_channel after its CQ was destroyed: %s (%d)", s,
			     strerror(rc), rc);
	}
}

/* The srq_context of scenario g's SRQ. */
/*
 * Posts `n` receives of 64 bytes to `srq`, receive i in slice i of `e`'s buffer with wr_id
 * `first_wr_id` + i; returns how many were posted.
 */
static int post_srq_slices(const char *scenario, struct ibv_srq *srq, struct ep *e, int n,
			   uint64_t first_wr_id)
{
	int posted = 0;

	for (int i = 0; i < n; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)e->buf + 64 * i, .length = 64,
				       .lkey = e->mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = first_wr_id + i, .sg_list = &sge, .num_sge = 1 };
		struct ibv_recv_wr *bad = NULL;

		posted += must_post(scenario, "SRQ receive", ibv_post_srq_recv(srq, &wr, &bad));
	}
	return posted;
}

static int srq_tag;

/*
 * g. An SRQ's limit event on the responder's asynchronous event queue. wr_ids 0x9n: g is not a
 * hex digit.
 */
static void scenario_srq_limit(struct dev *d0, struct dev *d1)
{
	const char *s = "srq limit";
	struct ibv_srq_init_attr sinit = {
		.srq_context = &srq_tag,
		.attr = { .max_wr = 16, .max_sge = 1 },
	};
	struct ibv_srq_attr sattr = { .srq_limit = 3 };
	struct ibv_context *ctx = d1->ctx, *other;
	struct ibv_async_event ev;
	struct timespec t0;
	struct ibv_srq *srq;
	struct ep snd, rcv;
	uint64_t seen = 0;
	int rc, r, found = 0, spurious = 0, posted = 0;

	srq = ibv_create_srq(d1->pd, &sinit);
	if (!srq)
		die("ibv_create_srq(%s): %s", d1->name, strerror(errno));
	ep_create(&snd, d0);
	ep_create_ex(&rcv, d1, NULL, NULL, srq); /* its buffer and MR hold the SRQ's receives */

	/* 4 receives of 64 bytes, each in its own slice of the receiver's buffer. */
	posted = post_srq_slices(s, srq, &rcv, 4, 0x91);
	/* Armed: one event once fewer than 3 WRs remain in the SRQ (ibv_modify_srq(3)). */
	rc = ibv_modify_srq(srq, &sattr, IBV_SRQ_LIMIT);
	if (rc)
		fail("%s: ibv_modify_srq(srq_limit 3): %s (%d)", s, strerror(rc), rc);
	connect_pair(&snd, &rcv);
	/* A second context on the receiver's device: events of the first one's objects are not
	 * its (on hardware too: each uverbs file gets the events of its own objects). */
	other = ibv_open_device(ctx->device);
	if (!other)
		die("ibv_open_device(%s) a second time: %s", d1->name, strerror(errno));

	/* 2 SENDs: 4 - 2 = 2 WRs left, below 3. */
	if (posted == 4 &&
	    must_post(s, "first SEND", post_send(&snd, IBV_WR_SEND, 0x95, 32, 0, 0)) &&
	    must_post(s, "second SEND", post_send(&snd, IBV_WR_SEND, 0x96, 32, 0, 0))) {
		for (int i = 0; i < 2; i++) {
			struct ibv_wc wc;
			int n = poll_one(rcv.cq, &wc, POLL_MS);

			/* Which SRQ WR a message takes is the device's business: any of the 4
			 * posted, each at most once. */
			if (n <= 0) {
				fail("%s: receiver: no completion %d of 2 within %d ms", s, i + 1,
				     POLL_MS);
				break;
			}
			printf("%s: receiver %s (%d)\n", s, ibv_wc_status_str(wc.status),
			       wc.status);
			if (wc.status != IBV_WC_SUCCESS)
				fail("%s: receiver: status %s (%d), expected success", s,
				     ibv_wc_status_str(wc.status), wc.status);
			if (wc.wr_id < 0x91 || wc.wr_id > 0x94 ||
			    (seen & (1u << (wc.wr_id - 0x91))))
				fail("%s: receiver: wr_id 0x%" PRIx64 ", expected one of "
				     "0x91..0x94 not seen before", s, (uint64_t)wc.wr_id);
			else
				seen |= 1u << (wc.wr_id - 0x91);
			if (wc.qp_num != rcv.qp->qp_num)
				fail("%s: receiver: qp_num 0x%06x, expected 0x%06x", s, wc.qp_num,
				     rcv.qp->qp_num);
		}
		expect_wc(s, "sender", &snd, 0x95, IBV_WC_SUCCESS, POLL_MS);
		expect_wc(s, "sender", &snd, 0x96, IBV_WC_SUCCESS, POLL_MS);

		/*
		 * Wait for the SRQ event. Other events may be queued on this context before it
		 * (IBV_EVENT_COMM_EST of f's or this responder QP, say): they are acked and
		 * ignored. So that draining them cannot block, async_fd is made non-blocking
		 * first: ibv_get_async_event then returns -1/EAGAIN once the queue is empty, and
		 * poll(2) waits for more (ibv_get_async_event(3)'s non-blocking example).
		 */
		set_nonblocking(ctx->async_fd, "async_fd");
		clock_gettime(CLOCK_MONOTONIC, &t0);
		while (!found) {
			long left = POLL_MS - elapsed_ms(&t0);
			int taken = 0;

			r = left > 0 ? fd_readable(ctx->async_fd, (int)left) : 0;
			if (r <= 0) {
				fail("%s: async_fd %s: no IBV_EVENT_SRQ_LIMIT_REACHED within %d ms",
				     s, readable_str(r), POLL_MS);
				break;
			}
			errno = 0;
			while (ibv_get_async_event(ctx, &ev) == 0) {
				int ours = ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED &&
					   ev.element.srq == srq;

				taken++;
				printf("%s: async event %s (%d)%s\n", s,
				       ibv_event_type_str(ev.event_type), ev.event_type,
				       ours ? " on the SRQ" : ": ignored");
				if (ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && !ours)
					fail("%s: SRQ limit event for SRQ %p, expected %p", s,
					     (void *)ev.element.srq, (void *)srq);
				else if (ours && found)
					fail("%s: a second SRQ limit event (one per arming)", s);
				found |= ours;
				ibv_ack_async_event(&ev);
				errno = 0;
			}
			if (errno != EAGAIN) {
				fail("%s: ibv_get_async_event: -1, errno %s (%d), expected "
				     "EAGAIN once drained", s, strerror(errno), errno);
				break;
			}
			/* poll(2) said readable, so there was an event to take (reported once; the
			 * wait goes on until the deadline). */
			if (!taken && !spurious) {
				spurious = 1;
				fail("%s: async_fd readable but ibv_get_async_event has no event "
				     "(EAGAIN)", s);
			}
		}
		/* Drained: the fd is not readable, unless an event came meanwhile to take. */
		r = fd_readable(ctx->async_fd, 0);
		errno = 0;
		rc = r > 0 ? ibv_get_async_event(ctx, &ev) : -1;
		printf("%s: async_fd after the drain: %s%s\n", s, readable_str(r),
		       r > 0 ? (rc == 0 ? ", with an event" : ", with no event (EAGAIN)") : "");
		if (rc == 0) {
			printf("%s: async event %s (%d): ignored\n", s,
			       ibv_event_type_str(ev.event_type), ev.event_type);
			ibv_ack_async_event(&ev);
		} else if (r != 0) {
			fail("%s: async_fd %s after the queue was drained, with no event to get", s,
			     readable_str(r));
		}
	}

	/* The limit fired, so it is disarmed: srq_limit 0 (ibv_query_srq(3)). */
	memset(&sattr, 0xff, sizeof(sattr));
	rc = ibv_query_srq(srq, &sattr);
	if (rc) {
		fail("%s: ibv_query_srq: %s (%d)", s, strerror(rc), rc);
	} else {
		printf("%s: ibv_query_srq: max_wr %u, max_sge %u, srq_limit %u\n", s, sattr.max_wr,
		       sattr.max_sge, sattr.srq_limit);
		if (found && sattr.srq_limit != 0)
			fail("%s: ibv_query_srq: srq_limit %u after the limit event, expected 0 "
			     "(disarmed)", s, sattr.srq_limit);
		if (sattr.max_wr < 16 || sattr.max_sge < 1)
			fail("%s: ibv_query_srq: max_wr %u, max_sge %u, expected at least 16 and 1",
			     s, sattr.max_wr, sattr.max_sge);
	}
	if (srq->srq_context != &srq_tag)
		fail("%s: srq->srq_context %p, expected %p", s, srq->srq_context, (void *)&srq_tag);

	r = fd_readable(other->async_fd, 100);
	printf("%s: a second context on %s: async_fd %s\n", s, d1->name, readable_str(r));
	if (r != 0)
		fail("%s: the second context's async_fd is %s: it has no events of its own", s,
		     readable_str(r));
	if (ibv_close_device(other))
		fail("cleanup: ibv_close_device(second context on %s)", d1->name);

	/* ibv_destroy_srq(3): EBUSY while a QP takes its receives from it. */
	rc = ibv_destroy_srq(srq);
	printf("%s: ibv_destroy_srq while its QP exists -> %d (%s)\n", s, rc,
	       rc ? strerror(rc) : "destroyed");
	if (rc != EBUSY)
		fail("%s: ibv_destroy_srq with a QP on it: %d, expected EBUSY (%d)", s, rc, EBUSY);

	ep_destroy(&snd);
	ep_destroy(&rcv); /* the QP first: an SRQ in use cannot go */
	rc = ibv_destroy_srq(srq);
	if (rc)
		fail("cleanup: ibv_destroy_srq(%s): %s (%d)", d1->name, strerror(rc), rc);
}

struct acker {
	struct ibv_comp_channel *ch;
	struct timespec acked_at;
	int got;
};

/* Takes one event, holds it 300 ms, then acks it. */
static void *late_acker(void *arg)
{
	struct acker *a = arg;
	struct ibv_cq *cq;
	void *ctx;

	if (ibv_get_cq_event(a->ch, &cq, &ctx) == 0) {
		a->got = 1;
		usleep(300 * 1000);
		clock_gettime(CLOCK_MONOTONIC, &a->acked_at);
		ibv_ack_cq_events(cq, 1);
	}
	return NULL;
}

static void scenario_destroy_waits_for_ack(struct dev *d0, struct dev *d1)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d1->ctx);
	struct ep a, b;
	struct acker ack = { .ch = ch };
	struct timespec done;
	pthread_t t;

	if (!ch)
		die("ibv_create_comp_channel: %s", strerror(errno));
	ep_create(&a, d0);
	ep_create_ex(&b, d1, ch, &b, NULL);
	connect_pair(&a, &b);
	must_post("i", "recv", post_recv(&b, 1, 64));
	if (ibv_req_notify_cq(b.cq, 0))
		fail("i: ibv_req_notify_cq");
	pthread_create(&t, NULL, late_acker, &ack);
	must_post("i", "send", post_send(&a, IBV_WR_SEND, 2, 64, 0, 0));
	expect_wc("i", "requester", &a, 2, IBV_WC_SUCCESS, 5000);
	/* The receive completed and its event went to the thread; drain the CQ. */
	expect_wc("i", "responder", &b, 1, IBV_WC_SUCCESS, 5000);
	usleep(50 * 1000);
	if (ibv_destroy_qp(b.qp))
		fail("i: ibv_destroy_qp");
	if (ibv_destroy_cq(b.cq))
		fail("i: ibv_destroy_cq");
	clock_gettime(CLOCK_MONOTONIC, &done);
	pthread_join(t, NULL);
	long early_ns = (ack.acked_at.tv_sec - done.tv_sec) * 1000000000L +
			(ack.acked_at.tv_nsec - done.tv_nsec);
	if (!ack.got)
		fail("i: the thread got no event");
	else if (early_ns > 0)
		fail("i: ibv_destroy_cq returned %ld us before the event's ack", early_ns / 1000);
	else
		printf("i: ibv_destroy_cq returned after the event's ack\n");
	ibv_dereg_mr(b.mr);
	free(b.buf);
	ep_destroy(&a);
	if (ibv_destroy_comp_channel(ch))
		fail("i: ibv_destroy_comp_channel");
}

/* The asynchronous half of i: what the event thread holds and when it let go. */
struct async_holder {
	struct ibv_context *ctx;
	struct ibv_qp *qp;
	struct ibv_srq *srq;
	struct timespec qp_acked_at, srq_acked_at;
	int got_qp, got_srq;
	int holding; /* set (atomically) once the thread holds what it will hold */
};

/*
 * Takes events until it holds the QP's IBV_EVENT_QP_LAST_WQE_REACHED and the SRQ's
 * IBV_EVENT_SRQ_LIMIT_REACHED (or POLL_MS passes), acking any other at once; then acks the
 * QP's 300 ms later and the SRQ's 300 ms after that.
 */
static void *late_async_acker(void *arg)
{
	struct async_holder *h = arg;
	struct ibv_async_event ev, qp_ev, srq_ev;
	struct timespec t0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (!(h->got_qp && h->got_srq) && elapsed_ms(&t0) < POLL_MS) {
		if (fd_readable(h->ctx->async_fd, 100) <= 0)
			continue;
		while (ibv_get_async_event(h->ctx, &ev) == 0) {
			if (!h->got_qp && ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED &&
			    ev.element.qp == h->qp) {
				qp_ev = ev;
				h->got_qp = 1;
			} else if (!h->got_srq && ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED &&
				   ev.element.srq == h->srq) {
				srq_ev = ev;
				h->got_srq = 1;
			} else {
				ibv_ack_async_event(&ev);
			}
		}
	}
	__atomic_store_n(&h->holding, 1, __ATOMIC_RELEASE);
	usleep(300 * 1000);
	clock_gettime(CLOCK_MONOTONIC, &h->qp_acked_at);
	if (h->got_qp)
		ibv_ack_async_event(&qp_ev);
	usleep(300 * 1000);
	clock_gettime(CLOCK_MONOTONIC, &h->srq_acked_at);
	if (h->got_srq)
		ibv_ack_async_event(&srq_ev);
	return NULL;
}

/* Nanoseconds from b to a. */
static long ns_between(const struct timespec *a, const struct timespec *b)
{
	return (a->tv_sec - b->tv_sec) * 1000000000L + (a->tv_nsec - b->tv_nsec);
}

static void scenario_destroy_waits_for_async_ack(struct dev *d0, struct dev *d1)
{
	const char *s = "i (asynchronous)";
	struct ibv_srq_init_attr sinit = { .attr = { .max_wr = 16, .max_sge = 1 } };
	struct ibv_srq_attr sattr = { .srq_limit = 3 };
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	struct async_holder h = { .ctx = d1->ctx };
	struct timespec qp_gone, srq_gone, t0;
	struct ibv_srq *srq;
	struct ep snd, rcv;
	pthread_t t;
	int posted = 0;

	srq = ibv_create_srq(d1->pd, &sinit);
	if (!srq)
		die("ibv_create_srq(%s): %s", d1->name, strerror(errno));
	ep_create(&snd, d0);
	ep_create_ex(&rcv, d1, NULL, NULL, srq);
	posted = post_srq_slices(s, srq, &rcv, 4, 0x1a0);
	if (ibv_modify_srq(srq, &sattr, IBV_SRQ_LIMIT))
		fail("%s: ibv_modify_srq(srq_limit 3)", s);
	connect_pair(&snd, &rcv);
	h.qp = rcv.qp;
	h.srq = srq;
	set_nonblocking(d1->ctx->async_fd, "async_fd");
	pthread_create(&t, NULL, late_async_acker, &h);
	if (posted == 4 &&
	    must_post(s, "first SEND", post_send(&snd, IBV_WR_SEND, 0x1a5, 32, 0, 0)) &&
	    must_post(s, "second SEND", post_send(&snd, IBV_WR_SEND, 0x1a6, 32, 0, 0))) {
		struct ibv_wc wc;

		expect_wc(s, "sender", &snd, 0x1a5, IBV_WC_SUCCESS, POLL_MS);
		expect_wc(s, "sender", &snd, 0x1a6, IBV_WC_SUCCESS, POLL_MS);
		for (int i = 0; i < 2; i++)
			if (poll_one(rcv.cq, &wc, POLL_MS) <= 0 || wc.status != IBV_WC_SUCCESS)
				fail("%s: receiver: no successful completion %d of 2", s, i + 1);
	}
	if (ibv_modify_qp(rcv.qp, &err, IBV_QP_STATE))
		fail("%s: ibv_modify_qp(ERR)", s);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (!__atomic_load_n(&h.holding, __ATOMIC_ACQUIRE) && elapsed_ms(&t0) < 2 * POLL_MS)
		usleep(1000);
	if (!h.got_qp)
		fail("%s: no IBV_EVENT_QP_LAST_WQE_REACHED for the QP moved to Error", s);
	if (!h.got_srq)
		fail("%s: no IBV_EVENT_SRQ_LIMIT_REACHED for the SRQ", s);
	if (ibv_destroy_qp(rcv.qp))
		fail("%s: ibv_destroy_qp", s);
	clock_gettime(CLOCK_MONOTONIC, &qp_gone);
	if (ibv_destroy_srq(srq))
		fail("%s: ibv_destroy_srq", s);
	clock_gettime(CLOCK_MONOTONIC, &srq_gone);
	pthread_join(t, NULL);
	if (h.got_qp && ns_between(&h.qp_acked_at, &qp_gone) > 0)
		fail("%s: ibv_destroy_qp returned %ld us before its event's ack", s,
		     ns_between(&h.qp_acked_at, &qp_gone) / 1000);
	else if (h.got_qp)
		printf("%s: ibv_destroy_qp returned after its event's ack\n", s);
	if (h.got_srq && ns_between(&h.srq_acked_at, &srq_gone) > 0)
		fail("%s: ibv_destroy_srq returned %ld us before its event's ack", s,
		     ns_between(&h.srq_acked_at, &srq_gone) / 1000);
	else if (h.got_srq)
		printf("%s: ibv_destroy_srq returned after its event's ack\n", s);
	if (ibv_destroy_cq(rcv.cq))
		fail("%s: cleanup: ibv_destroy_cq", s);
	if (ibv_dereg_mr(rcv.mr))
		fail("%s: cleanup: ibv_dereg_mr", s);
	free(rcv.buf);
	ep_destroy(&snd);
}

/* Waits up to POLL_MS for event `type` on `qp` at `ctx`, acking every event it takes. */
static int expect_async_event(const char *scenario, struct ibv_context *ctx,
			      enum ibv_event_type type, struct ibv_qp *qp)
{
	struct ibv_async_event ev;
	struct timespec t0;
	int found = 0;

	set_nonblocking(ctx->async_fd, "async_fd");
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (!found) {
		long left = POLL_MS - elapsed_ms(&t0);
		int r = left > 0 ? fd_readable(ctx->async_fd, (int)left) : 0;

		if (r <= 0) {
			fail("%s: async_fd %s: no %s for qp 0x%06x within %d ms", scenario,
			     readable_str(r), ibv_event_type_str(type), qp->qp_num, POLL_MS);
			return 0;
		}
		while (ibv_get_async_event(ctx, &ev) == 0) {
			found |= ev.event_type == type && ev.element.qp == qp;
			ibv_ack_async_event(&ev);
		}
	}
	return 1;
}

/* j. A peer's access into registered memory that the application has unmapped since. */
static void scenario_unmapped_after_registration(struct dev *d0, struct dev *d1)
{
	const char *s = "unmapped after registration";
	static const struct {
		const char *what;
		enum ibv_wr_opcode op;
	} ops[] = {
		{ "RDMA WRITE", IBV_WR_RDMA_WRITE },
		{ "RDMA READ", IBV_WR_RDMA_READ },
		{ "compare and swap", IBV_WR_ATOMIC_CMP_AND_SWP },
		{ "fetch and add", IBV_WR_ATOMIC_FETCH_AND_ADD },
	};
	size_t len = 2 * 4096;

	for (size_t k = 0; k < sizeof(ops) / sizeof(ops[0]); k++) {
		struct ep req, rsp;
		struct ibv_mr *gone;
		char *pages;

		make_pair(&req, d0, &rsp, d1);
		pages = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (pages == MAP_FAILED)
			die("mmap: %s", strerror(errno));
		gone = ibv_reg_mr(d1->pd, pages, len, MR_ACCESS);
		if (!gone)
			die("ibv_reg_mr(mapped pages): %s", strerror(errno));
		if (munmap(pages, len))
			die("munmap: %s", strerror(errno));
		{
			struct ibv_sge sge = { .addr = (uintptr_t)req.buf, .lkey = req.mr->lkey,
					       .length = ops[k].op == IBV_WR_RDMA_WRITE ||
								 ops[k].op == IBV_WR_RDMA_READ ?
							 3000 :
							 8 };
			struct ibv_send_wr wr = { .wr_id = 0xc0 + k, .sg_list = &sge, .num_sge = 1,
						  .opcode = ops[k].op,
						  .send_flags = IBV_SEND_SIGNALED };
			struct ibv_send_wr *bad = NULL;

			if (ops[k].op == IBV_WR_RDMA_WRITE || ops[k].op == IBV_WR_RDMA_READ) {
				wr.wr.rdma.remote_addr = (uintptr_t)pages + 100;
				wr.wr.rdma.rkey = gone->rkey;
			} else {
				wr.wr.atomic.remote_addr = (uintptr_t)pages + 4096;
				wr.wr.atomic.rkey = gone->rkey;
				wr.wr.atomic.compare_add = 1;
				wr.wr.atomic.swap = 2;
			}
			if (must_post(s, ops[k].what, ibv_post_send(req.qp, &wr, &bad))) {
				expect_wc(s, ops[k].what, &req, 0xc0 + k, IBV_WC_REM_ACCESS_ERR,
					  POLL_MS);
				expect_state(s, "responder", &rsp, IBV_QPS_ERR);
				if (expect_async_event(s, d1->ctx, IBV_EVENT_QP_ACCESS_ERR, rsp.qp))
					printf("%s: %s: IBV_WC_REM_ACCESS_ERR there, "
					       "IBV_EVENT_QP_ACCESS_ERR here\n",
					       s, ops[k].what);
			}
		}
		if (ibv_dereg_mr(gone))
			fail("%s: ibv_dereg_mr of the unmapped region", s);
		ep_destroy(&req);
		ep_destroy(&rsp);
	}
}

static void expect_rc(const char *scenario, const char *what, int rc, int want, int also)
{
	printf("%s: %s -> %s (%d)\n", scenario, what, rc ? strerror(rc) : "0", rc);
	if (rc != want && rc != also)
		fail("%s: %s: got %d (%s), expected %d (%s)", scenario, what, rc, strerror(rc), want,
		     strerror(want));
}

static void scenario_checks(struct dev *d0, struct dev *d1)
{
	const char *s = "k";
	struct ibv_port_attr port;
	struct ibv_qp_attr attr;
	struct ep a, b;
	int rc, rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;

	ep_create(&a, d0);
	ep_create(&b, d1);
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_INIT;
	attr.port_num = PORT;
	attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	attr.dest_qp_num = b.qp->qp_num;
	rc = ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						IBV_QP_ACCESS_FLAGS | IBV_QP_DEST_QPN);
	expect_rc(s, "ibv_modify_qp(RESET->INIT with IBV_QP_DEST_QPN)", rc, EINVAL, EINVAL);
	rc = ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						IBV_QP_ACCESS_FLAGS | (1 << 30));
	expect_rc(s, "ibv_modify_qp(RESET->INIT with mask bit 1 << 30)", rc, EOPNOTSUPP, EINVAL);
	expect_state(s, "after both", &a, IBV_QPS_RESET);
	rc = ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						IBV_QP_ACCESS_FLAGS);
	expect_rc(s, "ibv_modify_qp(RESET->INIT)", rc, 0, 0);

	if (ibv_query_port(d0->ctx, PORT, &port))
		die("ibv_query_port(%s)", d0->name);
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = IBV_MTU_1024;
	attr.dest_qp_num = b.qp->qp_num;
	attr.rq_psn = b.psn;
	attr.max_dest_rd_atomic = 1;
	attr.min_rnr_timer = 12;
	attr.ah_attr.is_global = 1;
	attr.ah_attr.grh.dgid = d1->gid;
	attr.ah_attr.grh.sgid_index = (uint8_t)port.gid_tbl_len;
	attr.ah_attr.grh.hop_limit = 64;
	attr.ah_attr.port_num = PORT;
	rc = ibv_modify_qp(a.qp, &attr, rtr_mask);
	expect_rc(s, "ibv_modify_qp(INIT->RTR with sgid_index = gid_tbl_len)", rc, EINVAL, EINVAL);
	expect_state(s, "after it", &a, IBV_QPS_INIT);
	/* An empty entry of the table: ENODATA from ibv_query_gid_ex, the zero GID from
	 * ibv_query_gid (as sysfs shows it), and no source GID for a QP or an AH. */
	for (int i = 1; i < port.gid_tbl_len && i < 256; i++) {
		struct ibv_gid_entry entry;
		union ibv_gid zero, got;
		struct ibv_ah_attr ah_attr;
		struct ibv_ah *ah;

		if (ibv_query_gid_ex(d0->ctx, PORT, i, &entry, 0) != ENODATA)
			continue;
		memset(&zero, 0, sizeof(zero));
		memset(&got, 0xff, sizeof(got));
		if (ibv_query_gid(d0->ctx, PORT, i, &got) || memcmp(&got, &zero, sizeof(zero)))
			fail("%s: ibv_query_gid of empty entry %d: not the zero GID", s, i);
		attr.ah_attr.grh.sgid_index = (uint8_t)i;
		rc = ibv_modify_qp(a.qp, &attr, rtr_mask);
		expect_rc(s, "ibv_modify_qp(INIT->RTR with an empty sgid_index)", rc, EINVAL, ENODATA);
		expect_state(s, "after it", &a, IBV_QPS_INIT);
		memset(&ah_attr, 0, sizeof(ah_attr));
		ah_attr.is_global = 1;
		ah_attr.grh.dgid = d1->gid;
		ah_attr.grh.sgid_index = (uint8_t)i;
		ah_attr.grh.hop_limit = 64;
		ah_attr.port_num = PORT;
		ah = ibv_create_ah(d0->pd, &ah_attr);
		if (ah) {
			fail("%s: ibv_create_ah with the empty sgid_index %d was created", s, i);
			ibv_destroy_ah(ah);
		}
		break;
	}

	connect_pair(&a, &b);
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTS;
	attr.path_mtu = IBV_MTU_512;
	rc = ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_PATH_MTU);
	expect_rc(s, "ibv_modify_qp(RTS->RTS with IBV_QP_PATH_MTU)", rc, EINVAL, EINVAL);
	attr.cur_qp_state = IBV_QPS_RTR;
	rc = ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE);
	expect_rc(s, "ibv_modify_qp(RTS->RTS, cur_qp_state RTR)", rc, EINVAL, EINVAL);
	attr.cur_qp_state = IBV_QPS_RTS;
	rc = ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE);
	expect_rc(s, "ibv_modify_qp(RTS->RTS, cur_qp_state RTS)", rc, 0, 0);
	expect_state(s, "after all", &a, IBV_QPS_RTS);
	ep_destroy(&a);
	ep_destroy(&b);

	{
		struct ibv_pd *pd = ibv_alloc_pd(d0->ctx);
		struct ibv_cq *cq = ibv_create_cq(d0->ctx, 4, NULL, NULL, 0);
		struct ibv_qp_init_attr init = {
			.send_cq = cq,
			.recv_cq = cq,
			.qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
				 .max_recv_sge = 1 },
		};
		static char buf[64];
		struct ibv_mr *mr;
		struct ibv_qp *qp;

		if (!pd || !cq)
			die("%s: ibv_alloc_pd / ibv_create_cq: %s", s, strerror(errno));
		mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
		if (!mr)
			die("%s: ibv_reg_mr: %s", s, strerror(errno));
		expect_rc(s, "ibv_dealloc_pd with an MR", ibv_dealloc_pd(pd), EBUSY, EBUSY);
		if (ibv_dereg_mr(mr))
			fail("%s: ibv_dereg_mr", s);
		qp = ibv_create_qp(pd, &init);
		if (!qp)
			die("%s: ibv_create_qp: %s", s, strerror(errno));
		expect_rc(s, "ibv_dealloc_pd with a QP", ibv_dealloc_pd(pd), EBUSY, EBUSY);
		if (ibv_destroy_qp(qp))
			fail("%s: ibv_destroy_qp", s);
		expect_rc(s, "ibv_dealloc_pd once unused", ibv_dealloc_pd(pd), 0, 0);
		if (ibv_destroy_cq(cq))
			fail("%s: ibv_destroy_cq", s);
	}

	{
		/* ibv_resize_cq(3): up or down, but never below what the CQ holds. Three receives
		 * flushed by a modify to ERR leave three completions in the CQ. */
		struct ep e;

		ep_create(&e, d0);
		memset(&attr, 0, sizeof(attr));
		attr.qp_state = IBV_QPS_INIT;
		attr.port_num = PORT;
		if (ibv_modify_qp(e.qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
							IBV_QP_ACCESS_FLAGS))
			die("%s: modify_qp INIT", s);
		for (int k = 0; k < 3; k++)
			must_post(s, "receive", post_recv(&e, 100 + k, 64));
		attr.qp_state = IBV_QPS_ERR;
		if (ibv_modify_qp(e.qp, &attr, IBV_QP_STATE))
			die("%s: modify_qp ERR", s);
		expect_rc(s, "ibv_resize_cq(64)", ibv_resize_cq(e.cq, 64), 0, 0);
		if (e.cq->cqe < 64)
			fail("%s: cqe %d after resizing to 64", s, e.cq->cqe);
		/* The modify to ERR flushed the receives (ibv_modify_qp(3)): they are queued. */
		{
			struct ibv_wc wc;

			expect_rc(s, "ibv_resize_cq(2) with 3 completions queued",
				  ibv_resize_cq(e.cq, 2), EINVAL, EINVAL);
			expect_rc(s, "ibv_resize_cq(3)", ibv_resize_cq(e.cq, 3), 0, 0);
			for (int k = 0; k < 3; k++)
				if (poll_one(e.cq, &wc, POLL_MS) != 1 || wc.wr_id != (uint64_t)(100 + k) ||
				    wc.status != IBV_WC_WR_FLUSH_ERR)
					fail("%s: flushed receive %d after the resize", s, k);
		}
		ep_destroy(&e);
	}

	{
		/* ibv_rereg_mr(3): translation, PD and access, keeping the struct ibv_mr. */
		static char one[128], two[128];
		struct ibv_pd *pd2 = ibv_alloc_pd(d0->ctx);
		struct ibv_mr *mr = ibv_reg_mr(d0->pd, one, sizeof(one), IBV_ACCESS_LOCAL_WRITE);
		uint32_t rkey;

		if (!pd2 || !mr)
			die("%s: ibv_alloc_pd / ibv_reg_mr: %s", s, strerror(errno));
		errno = 0;
		rc = ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0);
		printf("%s: ibv_rereg_mr(no flags) -> %d, errno %s\n", s, rc, strerror(errno));
		if (rc != IBV_REREG_MR_ERR_INPUT || errno != EINVAL)
			fail("%s: ibv_rereg_mr(no flags): expected IBV_REREG_MR_ERR_INPUT, EINVAL", s);
		rkey = mr->rkey;
		rc = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		expect_rc(s, "ibv_rereg_mr(CHANGE_ACCESS)", rc, 0, 0);
		printf("%s: rkey %s\n", s, mr->rkey != rkey ? "changed" : "kept");
		if (!strncmp(d0->name, "uroce", 5) && mr->rkey != rkey)
			fail("%s: uroce keeps the keys through ibv_rereg_mr, as rxe and mlx5 do", s);
		rc = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0);
		expect_rc(s, "ibv_rereg_mr(CHANGE_PD)", rc, 0, 0);
		if (mr->pd != pd2)
			fail("%s: mr->pd is not the new PD", s);
		expect_rc(s, "ibv_dealloc_pd of the MR's new PD", ibv_dealloc_pd(pd2), EBUSY, EBUSY);
		rc = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_TRANSLATION, d0->pd,
				  two, sizeof(two), 0);
		expect_rc(s, "ibv_rereg_mr(CHANGE_PD | CHANGE_TRANSLATION)", rc, 0, 0);
		if (mr->addr != two || mr->length != sizeof(two) || mr->pd != d0->pd)
			fail("%s: mr after CHANGE_PD | CHANGE_TRANSLATION: addr %p length %zu", s,
			     mr->addr, mr->length);
		expect_rc(s, "ibv_dealloc_pd once the MR left it", ibv_dealloc_pd(pd2), 0, 0);
		if (ibv_dereg_mr(mr))
			fail("%s: ibv_dereg_mr after rereg", s);
	}

	{
		int vectors = d0->ctx->num_comp_vectors;
		struct ibv_cq *cq;

		errno = 0;
		cq = ibv_create_cq(d0->ctx, 4, NULL, NULL, vectors);
		printf("%s: ibv_create_cq(comp_vector %d of %d) -> %s, errno %s\n", s, vectors, vectors,
		       cq ? "CQ" : "NULL", strerror(errno));
		if (cq || errno != EINVAL)
			fail("%s: ibv_create_cq with comp_vector %d: expected NULL with EINVAL", s,
			     vectors);
		if (cq)
			ibv_destroy_cq(cq);
	}

	{
		struct ibv_device_attr legacy;
		struct ibv_device_attr_ex ex;

		memset(&ex, 0xa5, sizeof(ex));
		rc = ibv_query_device_ex(d0->ctx, NULL, &ex);
		if (rc || ibv_query_device(d0->ctx, &legacy)) {
			fail("%s: ibv_query_device_ex: %d", s, rc);
			return;
		}
		printf("%s: ibv_query_device_ex: phys_port_cnt_ex %u, phys_port_cnt %u\n", s,
		       ex.phys_port_cnt_ex, ex.orig_attr.phys_port_cnt);
		if (ex.phys_port_cnt_ex != ex.orig_attr.phys_port_cnt || ex.phys_port_cnt_ex == 0)
			fail("%s: phys_port_cnt_ex %u, phys_port_cnt %u", s, ex.phys_port_cnt_ex,
			     ex.orig_attr.phys_port_cnt);
		/* Field by field: the padding between them is nobody's. */
		if (strcmp(legacy.fw_ver, ex.orig_attr.fw_ver) ||
		    legacy.node_guid != ex.orig_attr.node_guid ||
		    legacy.max_mr_size != ex.orig_attr.max_mr_size ||
		    legacy.vendor_id != ex.orig_attr.vendor_id ||
		    legacy.max_qp != ex.orig_attr.max_qp ||
		    legacy.max_qp_wr != ex.orig_attr.max_qp_wr ||
		    legacy.device_cap_flags != ex.orig_attr.device_cap_flags ||
		    legacy.max_sge != ex.orig_attr.max_sge || legacy.max_cqe != ex.orig_attr.max_cqe ||
		    legacy.max_mr != ex.orig_attr.max_mr ||
		    legacy.max_qp_rd_atom != ex.orig_attr.max_qp_rd_atom ||
		    legacy.atomic_cap != ex.orig_attr.atomic_cap ||
		    legacy.max_srq_wr != ex.orig_attr.max_srq_wr ||
		    legacy.max_pkeys != ex.orig_attr.max_pkeys ||
		    legacy.phys_port_cnt != ex.orig_attr.phys_port_cnt)
			fail("%s: ibv_query_device_ex's orig_attr differs from ibv_query_device", s);
		if ((ex.device_cap_flags_ex & 0xffffffffu) != legacy.device_cap_flags)
			fail("%s: device_cap_flags_ex %#" PRIx64 " lacks the legacy flags %#x", s,
			     (uint64_t)ex.device_cap_flags_ex, legacy.device_cap_flags);
	}
}

/* The device clock now, in ns (ibv_query_rt_values_ex(3), IBV_VALUES_MASK_RAW_CLOCK). */
static uint64_t raw_clock(struct dev *d)
{
	struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	int rc = ibv_query_rt_values_ex(d->ctx, &v);

	if (rc) {
		fail("cq_ex: ibv_query_rt_values_ex: %s", strerror(rc));
		return 0;
	}
	if (v.comp_mask != IBV_VALUES_MASK_RAW_CLOCK)
		fail("cq_ex: ibv_query_rt_values_ex: comp_mask 0x%x", v.comp_mask);
	return (uint64_t)v.raw_clock.tv_sec * 1000000000u + (uint64_t)v.raw_clock.tv_nsec;
}

/* ibv_start_poll until a completion comes (0) or the deadline passes (ENOENT). */
static int start_poll_wait(struct ibv_cq_ex *cq)
{
	struct ibv_poll_cq_attr attr = { 0 };
	struct timespec t0;
	int rc;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	while ((rc = ibv_start_poll(cq, &attr)) == ENOENT && elapsed_ms(&t0) < POLL_MS)
		;
	return rc;
}

/*
 * l. the extended CQ (ibv_create_cq_ex(3)): ibv_query_device_ex reports a completion timestamp
 *    mask and hca_core_clock; ibv_query_rt_values_ex reads a clock that moves forward;
 *    ibv_create_cq_ex refuses what it cannot report (CVLAN: EOPNOTSUPP), unknown comp_mask bits
 *    and a comp_vector the context lacks (EINVAL). A SEND with immediate to a QP whose CQ is
 *    extended is read field by field after ibv_start_poll; its completion timestamp lies
 *    between two raw-clock readings around it and its wall-clock stamp near CLOCK_REALTIME.
 *    Two completions come from start_poll then next_poll, in order with non-decreasing
 *    stamps; a third through ibv_poll_cq on ibv_cq_ex_to_cq (one queue, two interfaces);
 *    an empty CQ answers ENOENT, and a poll attribute comp_mask EINVAL.
 */
static void scenario_cq_ex(struct dev *d0, struct dev *d1)
{
	const char *sc = "cq_ex";
	const uint64_t wanted = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
				IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
	struct ibv_cq_init_attr_ex ca = { .cqe = CQ_DEPTH, .wc_flags = wanted };
	struct ibv_device_attr_ex dx;
	struct ibv_poll_cq_attr bad_attr = { .comp_mask = 1 };
	struct ibv_cq_ex *cqx, *refused;
	struct ep a, b;
	struct ibv_wc wc;
	uint64_t t0, t1, ts, ts2;
	struct timespec wall;
	int64_t skew;
	int rc;

	if (ibv_query_device_ex(d1->ctx, NULL, &dx))
		fail("%s: ibv_query_device_ex", sc);
	else if (!dx.completion_timestamp_mask || !dx.hca_core_clock)
		fail("%s: no timestamps: mask 0x%" PRIx64 ", hca_core_clock %" PRIu64 " kHz", sc,
		     (uint64_t)dx.completion_timestamp_mask, (uint64_t)dx.hca_core_clock);
	t0 = raw_clock(d1);
	t1 = raw_clock(d1);
	if (t1 < t0)
		fail("%s: the raw clock went back: %" PRIu64 " then %" PRIu64, sc, t0, t1);

	ca.wc_flags = IBV_WC_EX_WITH_CVLAN;
	refused = ibv_create_cq_ex(d1->ctx, &ca);
	if (refused || errno != EOPNOTSUPP)
		fail("%s: wc_flags CVLAN: %s, expected EOPNOTSUPP", sc,
		     refused ? "created" : strerror(errno));
	ca.wc_flags = wanted;
	ca.comp_mask = 1u << 7;
	refused = ibv_create_cq_ex(d1->ctx, &ca);
	if (refused || errno != EINVAL)
		fail("%s: comp_mask 1 << 7: %s, expected EINVAL", sc,
		     refused ? "created" : strerror(errno));
	ca.comp_mask = 0;
	ca.comp_vector = d1->ctx->num_comp_vectors;
	refused = ibv_create_cq_ex(d1->ctx, &ca);
	if (refused || errno != EINVAL)
		fail("%s: comp_vector %d: %s, expected EINVAL", sc, d1->ctx->num_comp_vectors,
		     refused ? "created" : strerror(errno));
	ca.comp_vector = 0;
	ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
	ca.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
	cqx = ibv_create_cq_ex(d1->ctx, &ca);
	if (!cqx)
		die("%s: ibv_create_cq_ex: %s", sc, strerror(errno));

	ep_create(&a, d0);
	memset(&b, 0, sizeof(b));
	b.cq = ibv_cq_ex_to_cq(cqx);
	ep_attach(&b, d1, NULL);
	connect_pair(&a, &b);

	rc = ibv_start_poll(cqx, &bad_attr);
	if (rc != EINVAL)
		fail("%s: start_poll with comp_mask 1: %d, expected EINVAL", sc, rc);
	rc = ibv_start_poll(cqx, &(struct ibv_poll_cq_attr){ 0 });
	if (rc != ENOENT)
		fail("%s: start_poll on an empty CQ: %d, expected ENOENT", sc, rc);

	/* One SEND with immediate, read field by field. */
	must_post(sc, "recv 1", post_recv(&b, 1, BUF_SIZE));
	t0 = raw_clock(d1);
	{
		struct ibv_sge sge = { (uintptr_t)a.buf, 100, a.mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 10, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND_WITH_IMM,
					  .send_flags = IBV_SEND_SIGNALED,
					  .imm_data = htonl(0x12345678) };
		struct ibv_send_wr *bad;

		must_post(sc, "send with imm", ibv_post_send(a.qp, &wr, &bad));
	}
	expect_wc(sc, "sender", &a, 10, IBV_WC_SUCCESS, POLL_MS);
	rc = start_poll_wait(cqx);
	t1 = raw_clock(d1);
	if (rc) {
		fail("%s: start_poll: %d, expected a completion", sc, rc);
	} else {
		ts = ibv_wc_read_completion_ts(cqx);
		clock_gettime(CLOCK_REALTIME, &wall);
		skew = (int64_t)((uint64_t)wall.tv_sec * 1000000000u + (uint64_t)wall.tv_nsec -
				 ibv_wc_read_completion_wallclock_ns(cqx));
		printf("%s: receive %s, %u bytes, stamped %" PRIu64 " ns after the post\n", sc,
		       ibv_wc_status_str(cqx->status), ibv_wc_read_byte_len(cqx), ts - t0);
		if (cqx->status != IBV_WC_SUCCESS || cqx->wr_id != 1)
			fail("%s: status %d wr_id %" PRIu64, sc, cqx->status, (uint64_t)cqx->wr_id);
		if (ibv_wc_read_opcode(cqx) != IBV_WC_RECV)
			fail("%s: opcode %d, expected IBV_WC_RECV", sc, ibv_wc_read_opcode(cqx));
		if (ibv_wc_read_byte_len(cqx) != 100)
			fail("%s: byte_len %u, expected 100", sc, ibv_wc_read_byte_len(cqx));
		if (ntohl(ibv_wc_read_imm_data(cqx)) != 0x12345678)
			fail("%s: imm 0x%x", sc, ntohl(ibv_wc_read_imm_data(cqx)));
		if (!(ibv_wc_read_wc_flags(cqx) & IBV_WC_WITH_IMM))
			fail("%s: wc_flags 0x%x lack IBV_WC_WITH_IMM", sc, ibv_wc_read_wc_flags(cqx));
		if (ibv_wc_read_qp_num(cqx) != b.qp->qp_num)
			fail("%s: qp_num 0x%x, expected 0x%x", sc, ibv_wc_read_qp_num(cqx),
			     b.qp->qp_num);
		if (ibv_wc_read_src_qp(cqx) != a.qp->qp_num)
			fail("%s: src_qp 0x%x, expected 0x%x", sc, ibv_wc_read_src_qp(cqx),
			     a.qp->qp_num);
		if (ts < t0 || ts > t1)
			fail("%s: timestamp %" PRIu64 " outside [%" PRIu64 ", %" PRIu64 "]", sc, ts,
			     t0, t1);
		if (skew < -1000000000LL || skew > 1000000000LL)
			fail("%s: wall-clock stamp %" PRId64 " ns from CLOCK_REALTIME", sc, skew);
		rc = ibv_next_poll(cqx);
		if (rc != ENOENT)
			fail("%s: next_poll after the only completion: %d, expected ENOENT", sc, rc);
		ibv_end_poll(cqx);
	}

	/* Two completions in one poll, then one through the legacy interface. */
	for (int i = 0; i < 3; i++) {
		must_post(sc, "recv", post_recv(&b, 20 + i, BUF_SIZE));
		must_post(sc, "send", post_send(&a, IBV_WR_SEND, 30 + i, 8, 0, 0));
		expect_wc(sc, "sender", &a, 30 + i, IBV_WC_SUCCESS, POLL_MS);
	}
	rc = start_poll_wait(cqx);
	if (rc) {
		fail("%s: start_poll: %d, expected the first of three", sc, rc);
	} else {
		ts = ibv_wc_read_completion_ts(cqx);
		if (cqx->wr_id != 20)
			fail("%s: first wr_id %" PRIu64 ", expected 20", sc, (uint64_t)cqx->wr_id);
		rc = ibv_next_poll(cqx);
		ts2 = rc ? 0 : ibv_wc_read_completion_ts(cqx);
		if (rc || cqx->wr_id != 21)
			fail("%s: next_poll: %d, wr_id %" PRIu64 ", expected 21", sc, rc,
			     (uint64_t)cqx->wr_id);
		else if (ts2 < ts)
			fail("%s: stamps out of order: %" PRIu64 " then %" PRIu64, sc, ts, ts2);
		ibv_end_poll(cqx);
	}
	if (poll_one(b.cq, &wc, POLL_MS) != 1 || wc.wr_id != 22 || wc.status != IBV_WC_SUCCESS)
		fail("%s: ibv_poll_cq on ibv_cq_ex_to_cq: no completion 22", sc);
	expect_no_wc(sc, "receiver", &b);
	ep_destroy(&a);
	ep_destroy(&b);
}

/* An RC QP on e's CQ from ibv_create_qp_ex, for the ibv_wr_* operations `send_ops`. */
static struct ibv_qp *create_qp_ex_ops(struct ep *e, struct dev *d, uint64_t send_ops)
{
	struct ibv_qp_init_attr_ex init = {
		.qp_type = IBV_QPT_RC,
		.send_cq = e->cq,
		.recv_cq = e->cq,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 2, .max_recv_sge = 1,
			 .max_inline_data = 64 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = d->pd,
		.send_ops_flags = send_ops,
	};

	return ibv_create_qp_ex(d->ctx, &init);
}

/*
 * m. the extended QP's send API (ibv_wr_post(3)): ibv_qp_to_qp_ex is NULL for a legacy QP and
 *    the extension for one created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS; send_ops_flags the
 *    device lacks (ATOMIC_WRITE) fail the creation with EOPNOTSUPP. Between ibv_wr_start and
 *    ibv_wr_complete: a SEND from an SGE list, a SEND with immediate from inline data (the
 *    buffer overwritten before the complete, as the copy is taken at the call), an RDMA
 *    WRITE with immediate, a READ and a FETCH_AND_ADD, all posted by one complete and each
 *    completing with its wr_id and effect. A batch is refused whole: a setter before any
 *    builder makes ibv_wr_complete return EINVAL and the good request after it is not
 *    posted either; ibv_wr_abort drops what was built.
 */
static void scenario_wr_api(struct dev *d0, struct dev *d1)
{
	const char *sc = "wr_api";
	const uint64_t ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
			     IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
			     IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_ATOMIC_WRITE;
	const uint64_t word = 0x0102030405060708ull;
	struct ep a, b;
	struct ibv_qp *legacy, *refused;
	struct ibv_qp_ex *qpx;
	struct ibv_sge two[2];
	char inline_buf[16];
	uint64_t *counter;
	int rc;

	ep_create(&a, d0);
	ep_create(&b, d1);
	if (ibv_qp_to_qp_ex(a.qp))
		fail("%s: ibv_qp_to_qp_ex of a legacy QP is not NULL", sc);
	refused = create_qp_ex_ops(&a, d0, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_TSO);
	if (refused || errno != EOPNOTSUPP)
		fail("%s: send_ops TSO on RC: %s, expected EOPNOTSUPP", sc,
		     refused ? "created" : strerror(errno));
	/* Swap a's QP for an extended one on the same CQ. */
	legacy = a.qp;
	a.qp = create_qp_ex_ops(&a, d0, ops);
	if (!a.qp)
		die("%s: ibv_create_qp_ex: %s", sc, strerror(errno));
	if (ibv_destroy_qp(legacy))
		fail("%s: ibv_destroy_qp", sc);
	a.psn = (a.qp->qp_num * 2654435761u) & 0xffffff;
	qpx = ibv_qp_to_qp_ex(a.qp);
	if (!qpx)
		die("%s: ibv_qp_to_qp_ex of an extended QP is NULL", sc);
	connect_pair(&a, &b);

	counter = (uint64_t *)(b.buf + 1024);
	*counter = 40;
	memcpy(a.buf, "scatter", 7);
	memcpy(a.buf + 64, "gather", 6);
	two[0] = (struct ibv_sge){ (uintptr_t)a.buf, 7, a.mr->lkey };
	two[1] = (struct ibv_sge){ (uintptr_t)(a.buf + 64), 6, a.mr->lkey };
	memcpy(inline_buf, "inline!", 8);
	for (int i = 0; i < 3; i++) {
		struct ibv_sge sge = { (uintptr_t)(b.buf + 256 * i), 256, b.mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 1 + i, .sg_list = &sge, .num_sge = 1 };
		struct ibv_recv_wr *bad;

		must_post(sc, "recv", ibv_post_recv(b.qp, &wr, &bad));
	}

	ibv_wr_start(qpx);
	qpx->wr_id = 11;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qpx);
	ibv_wr_set_sge_list(qpx, 2, two);
	qpx->wr_id = 12;
	qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send_imm(qpx, htonl(7));
	ibv_wr_set_inline_data(qpx, inline_buf, 8);
	memcpy(inline_buf, "CHANGED", 8);
	qpx->wr_id = 13;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write_imm(qpx, b.mr->rkey, (uintptr_t)(b.buf + 2048), htonl(9));
	ibv_wr_set_sge(qpx, a.mr->lkey, (uintptr_t)a.buf, 7);
	qpx->wr_id = 14;
	ibv_wr_rdma_read(qpx, b.mr->rkey, (uintptr_t)(b.buf + 2048));
	ibv_wr_set_sge(qpx, a.mr->lkey, (uintptr_t)(a.buf + 512), 7);
	qpx->wr_id = 15;
	ibv_wr_atomic_fetch_add(qpx, b.mr->rkey, (uintptr_t)counter, 2);
	ibv_wr_set_sge(qpx, a.mr->lkey, (uintptr_t)(a.buf + 1024), 8);
	/* IBA 1.5's atomic write: the 8 bytes are taken at the call. */
	qpx->wr_id = 16;
	ibv_wr_atomic_write(qpx, b.mr->rkey, (uintptr_t)(b.buf + 1536), &word);
	rc = ibv_wr_complete(qpx);
	if (rc)
		fail("%s: ibv_wr_complete: %s", sc, strerror(rc));
	for (uint64_t id = 11; id <= 16; id++)
		expect_wc(sc, "requester", &a, id, IBV_WC_SUCCESS, POLL_MS);
	for (uint64_t id = 1; id <= 3; id++)
		expect_wc(sc, "responder", &b, id, IBV_WC_SUCCESS, POLL_MS);
	if (memcmp(b.buf, "scattergather", 13))
		fail("%s: the SGE-list SEND brought \"%.13s\"", sc, b.buf);
	if (memcmp(b.buf + 256, "inline!", 8))
		fail("%s: the inline SEND brought \"%.8s\" (not copied at the call?)", sc,
		     b.buf + 256);
	if (memcmp(b.buf + 2048, "scatter", 7))
		fail("%s: WRITE left \"%.7s\"", sc, b.buf + 2048);
	if (memcmp(a.buf + 512, "scatter", 7))
		fail("%s: READ brought \"%.7s\"", sc, a.buf + 512);
	if (*(uint64_t *)(a.buf + 1024) != 40 || *counter != 42)
		fail("%s: FETCH_AND_ADD returned %" PRIu64 ", left %" PRIu64, sc,
		     *(uint64_t *)(a.buf + 1024), *counter);
	if (memcmp(b.buf + 1536, &word, 8))
		fail("%s: ATOMIC_WRITE left %016" PRIx64, sc, *(uint64_t *)(b.buf + 1536));
	expect_no_wc(sc, "requester", &a);

	/* A setter before any builder: the batch fails whole, a good request with it. */
	ibv_wr_start(qpx);
	ibv_wr_set_sge(qpx, a.mr->lkey, (uintptr_t)a.buf, 4);
	qpx->wr_id = 21;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, a.mr->lkey, (uintptr_t)a.buf, 4);
	rc = ibv_wr_complete(qpx);
	if (rc != EINVAL)
		fail("%s: setter before builder: ibv_wr_complete %d, expected EINVAL", sc, rc);
	/* Aborted: nothing is sent. */
	ibv_wr_start(qpx);
	qpx->wr_id = 22;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, a.mr->lkey, (uintptr_t)a.buf, 4);
	ibv_wr_abort(qpx);
	expect_no_wc(sc, "requester", &a);
	expect_no_wc(sc, "responder", &b);

	ep_destroy(&a);
	ep_destroy(&b);
}

/* Polls one completion of e's CQ into *wc: 1 when one came within POLL_MS. */
static int take_wc(struct ep *e, struct ibv_wc *wc)
{
	memset(wc, 0, sizeof(*wc));
	return poll_one(e->cq, wc, POLL_MS) == 1;
}

/* A's 8-byte RDMA WRITE at `raddr` through `rkey`, with its status (-1: no completion). */
static int write_via(struct ep *a, uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
	struct ibv_wc wc;

	if (post_send(a, IBV_WR_RDMA_WRITE, wr_id, 8, raddr, rkey))
		return -1;
	return take_wc(a, &wc) ? (int)wc.status : -1;
}

/*
 * n. memory windows (IBA 10.6.7; ibv_alloc_mw(3), ibv_bind_mw(3), ibv_post_send(3)): the device
 *    reports IBV_DEVICE_MEM_WINDOW and _TYPE_2B. Type 1: ibv_bind_mw on the responder's QP
 *    gives mw->rkey a new tag at once and completes IBV_WC_BIND_MW; a WRITE inside the
 *    window lands, one a byte past its end fails with IBV_WC_REM_ACCESS_ERR. Type 2 (fresh
 *    pair): an IBV_WR_BIND_MW work request binds it; a peer's SEND with invalidate
 *    (IBV_WR_SEND_WITH_INV) completes the receive with IBV_WC_WITH_INV and the key in
 *    invalidated_rkey, and the next WRITE through that key fails. A region without
 *    IBV_ACCESS_MW_BIND cannot carry a window: the bind completes with IBV_WC_MW_BIND_ERR.
 *    A PD with a window cannot be deallocated (EBUSY); ibv_alloc_mw of type 3 is EINVAL.
 */
static void scenario_mw(struct dev *d0, struct dev *d1)
{
	const char *sc = "mw";
	struct ibv_device_attr attr;
	struct ibv_mr *bindable, *plain;
	struct ibv_mw *mw, *bad;
	struct ibv_wc wc;
	struct ep a, b;
	uint32_t old, key;
	int rc;

	if (ibv_query_device(d1->ctx, &attr))
		fail("%s: ibv_query_device", sc);
	else if (!(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW) ||
		 !(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) || !attr.max_mw)
		fail("%s: device_cap_flags 0x%x, max_mw %d: no memory windows", sc,
		     attr.device_cap_flags, attr.max_mw);
	bad = ibv_alloc_mw(d1->pd, 3);
	if (bad || errno != EINVAL)
		fail("%s: ibv_alloc_mw type 3: %s, expected EINVAL", sc, bad ? "made" : strerror(errno));

	/* Type 1. */
	make_pair(&a, d0, &b, d1);
	bindable = ibv_reg_mr(d1->pd, b.buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	mw = ibv_alloc_mw(d1->pd, IBV_MW_TYPE_1);
	if (!bindable || !mw)
		die("%s: ibv_reg_mr(MW_BIND) / ibv_alloc_mw: %s", sc, strerror(errno));
	old = mw->rkey;
	{
		struct ibv_mw_bind bind = {
			.wr_id = 71,
			.send_flags = IBV_SEND_SIGNALED,
			.bind_info = { .mr = bindable, .addr = (uintptr_t)(b.buf + 1024), .length = 512,
				       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE },
		};

		rc = ibv_bind_mw(b.qp, mw, &bind);
	}
	if (rc)
		fail("%s: ibv_bind_mw: %s", sc, strerror(rc));
	if (mw->rkey == old || (mw->rkey >> 8) != (old >> 8))
		fail("%s: ibv_bind_mw left the key 0x%x (was 0x%x): a new tag is expected", sc,
		     mw->rkey, old);
	if (!take_wc(&b, &wc) || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_BIND_MW ||
	    wc.wr_id != 71)
		fail("%s: bind completion: status %d opcode %d wr_id %" PRIu64, sc, wc.status,
		     wc.opcode, (uint64_t)wc.wr_id);
	memcpy(a.buf, "windowed", 8);
	rc = write_via(&a, (uintptr_t)(b.buf + 1024 + 504), mw->rkey, 72);
	if (rc != IBV_WC_SUCCESS || memcmp(b.buf + 1024 + 504, "windowed", 8))
		fail("%s: WRITE at the window's end: status %d", sc, rc);
	rc = write_via(&a, (uintptr_t)(b.buf + 1024 + 505), mw->rkey, 73);
	printf("%s: WRITE one byte past a type 1 window: %s\n", sc,
	       ibv_wc_status_str((enum ibv_wc_status)rc));
	if (rc != IBV_WC_REM_ACCESS_ERR)
		fail("%s: WRITE past the window: status %d, expected IBV_WC_REM_ACCESS_ERR", sc, rc);
	if ((rc = ibv_dealloc_pd(d1->pd)) != EBUSY)
		fail("%s: ibv_dealloc_pd with a window: %d, expected EBUSY", sc, rc);
	if (ibv_dealloc_mw(mw))
		fail("%s: ibv_dealloc_mw", sc);
	ep_destroy(&a);
	ep_destroy(&b);
	if (ibv_dereg_mr(bindable))
		fail("%s: ibv_dereg_mr", sc);

	/* Type 2: bound by a work request, freed by the peer's SEND with invalidate. */
	make_pair(&a, d0, &b, d1);
	bindable = ibv_reg_mr(d1->pd, b.buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	mw = ibv_alloc_mw(d1->pd, IBV_MW_TYPE_2);
	if (!bindable || !mw)
		die("%s: ibv_reg_mr(MW_BIND) / ibv_alloc_mw(2): %s", sc, strerror(errno));
	key = ibv_inc_rkey(mw->rkey);
	{
		struct ibv_send_wr wr = { .wr_id = 81, .opcode = IBV_WR_BIND_MW,
					  .send_flags = IBV_SEND_SIGNALED };
		struct ibv_send_wr *badwr;

		wr.bind_mw.mw = mw;
		wr.bind_mw.rkey = key;
		wr.bind_mw.bind_info = (struct ibv_mw_bind_info){
			.mr = bindable, .addr = (uintptr_t)b.buf, .length = 2048,
			.mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
		must_post(sc, "bind type 2", ibv_post_send(b.qp, &wr, &badwr));
	}
	if (!take_wc(&b, &wc) || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_BIND_MW)
		fail("%s: type 2 bind: status %d opcode %d", sc, wc.status, wc.opcode);
	if ((rc = write_via(&a, (uintptr_t)(b.buf + 8), key, 82)) != IBV_WC_SUCCESS)
		fail("%s: WRITE through a type 2 window: status %d", sc, rc);
	must_post(sc, "recv", post_recv(&b, 83, 64));
	{
		struct ibv_sge sge = { (uintptr_t)a.buf, 8, a.mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 84, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND_WITH_INV,
					  .send_flags = IBV_SEND_SIGNALED,
					  .invalidate_rkey = key };
		struct ibv_send_wr *badwr;

		must_post(sc, "send with invalidate", ibv_post_send(a.qp, &wr, &badwr));
	}
	expect_wc(sc, "sender", &a, 84, IBV_WC_SUCCESS, POLL_MS);
	if (!take_wc(&b, &wc) || wc.status != IBV_WC_SUCCESS || !(wc.wc_flags & IBV_WC_WITH_INV) ||
	    wc.invalidated_rkey != key)
		fail("%s: receive of SEND with invalidate: status %d flags 0x%x key 0x%x (want 0x%x)",
		     sc, wc.status, wc.wc_flags, wc.invalidated_rkey, key);
	else
		printf("%s: receive with IBV_WC_WITH_INV, invalidated_rkey 0x%x\n", sc,
		       wc.invalidated_rkey);
	rc = write_via(&a, (uintptr_t)(b.buf + 8), key, 85);
	if (rc != IBV_WC_REM_ACCESS_ERR)
		fail("%s: WRITE through an invalidated window: status %d, expected REM_ACCESS_ERR",
		     sc, rc);
	if (ibv_dealloc_mw(mw))
		fail("%s: ibv_dealloc_mw(2)", sc);
	ep_destroy(&a);
	ep_destroy(&b);
	if (ibv_dereg_mr(bindable))
		fail("%s: ibv_dereg_mr", sc);

	/* A region without MW_BIND: the bind fails in its completion. */
	ep_create(&b, d1);
	ep_create(&a, d0);
	connect_pair(&a, &b);
	plain = b.mr;
	mw = ibv_alloc_mw(d1->pd, IBV_MW_TYPE_1);
	if (!mw)
		die("%s: ibv_alloc_mw: %s", sc, strerror(errno));
	{
		struct ibv_mw_bind bind = {
			.wr_id = 91,
			.send_flags = IBV_SEND_SIGNALED,
			.bind_info = { .mr = plain, .addr = (uintptr_t)b.buf, .length = 64,
				       .mw_access_flags = IBV_ACCESS_REMOTE_READ },
		};

		rc = ibv_bind_mw(b.qp, mw, &bind);
	}
	if (rc)
		fail("%s: ibv_bind_mw (no MW_BIND): post refused %s", sc, strerror(rc));
	else if (!take_wc(&b, &wc) || wc.status != IBV_WC_MW_BIND_ERR)
		fail("%s: bind over a region without MW_BIND: status %d, expected MW_BIND_ERR", sc,
		     wc.status);
	else
		printf("%s: bind over a region without MW_BIND: %s\n", sc,
		       ibv_wc_status_str(wc.status));
	if (ibv_dealloc_mw(mw))
		fail("%s: ibv_dealloc_mw", sc);
	ep_destroy(&a);
	ep_destroy(&b);
}

/*
 * o. on-demand paging (ibv_reg_mr(3) IBV_ACCESS_ON_DEMAND, ibv_advise_mr(3)): the device
 *    reports ODP for RC send, receive, write, read and atomics, and implicit ODP. An
 *    on-demand region over memory that is not mapped registers (nothing is pinned or looked
 *    at; without ON_DEMAND the same call is EFAULT); once the memory is mapped, a peer's
 *    RDMA WRITE into its untouched pages lands. An implicit region (addr NULL, length
 *    SIZE_MAX) carries a SEND from any buffer through one lkey; without ON_DEMAND that
 *    registration is EINVAL. ibv_advise_mr prefetches (PREFETCH_WRITE, NO_FAULT, with
 *    IBV_ADVISE_MR_FLAG_FLUSH), and refuses an unknown advice (EOPNOTSUPP), a region that is
 *    not on-demand (EINVAL) and memory that is not mapped (EFAULT).
 */
static void scenario_odp(struct dev *d0, struct dev *d1)
{
	const char *sc = "odp";
	const size_t len = 4 * 4096;
	struct ibv_device_attr_ex dx;
	struct ibv_mr *odp, *refused, *implicit;
	struct ibv_sge sge;
	struct ep a, b;
	char *area;
	int rc;

	if (ibv_query_device_ex(d1->ctx, NULL, &dx))
		fail("%s: ibv_query_device_ex", sc);
	else if (!(dx.odp_caps.general_caps & IBV_ODP_SUPPORT) ||
		 !(dx.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT) ||
		 (dx.odp_caps.per_transport_caps.rc_odp_caps &
		  (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE)) !=
			 (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE))
		fail("%s: odp_caps 0x%" PRIx64 "/0x%x", sc, (uint64_t)dx.odp_caps.general_caps,
		     dx.odp_caps.per_transport_caps.rc_odp_caps);

	/* A hole in the address space: reserved, then unmapped. */
	area = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (area == MAP_FAILED)
		die("%s: mmap", sc);
	munmap(area, len);
	refused = ibv_reg_mr(d1->pd, area, len, IBV_ACCESS_LOCAL_WRITE);
	if (refused || errno != EFAULT)
		fail("%s: pinned registration of unmapped memory: %s, expected EFAULT", sc,
		     refused ? "registered" : strerror(errno));
	odp = ibv_reg_mr(d1->pd, area, len,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ON_DEMAND);
	if (!odp)
		die("%s: on-demand registration of unmapped memory: %s", sc, strerror(errno));
	sge = (struct ibv_sge){ (uintptr_t)area, 4096, odp->lkey };
	rc = ibv_advise_mr(d1->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
			   &sge, 1);
	if (rc != EFAULT)
		fail("%s: prefetch of unmapped memory: %d, expected EFAULT", sc, rc);
	/* Now the memory is there, untouched. */
	if (mmap(area, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
	    area)
		die("%s: mmap at the hole", sc);
	rc = ibv_advise_mr(d1->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
			   &sge, 1);
	if (rc)
		fail("%s: PREFETCH_WRITE: %s", sc, strerror(rc));
	rc = ibv_advise_mr(d1->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &sge, 1);
	if (rc)
		fail("%s: PREFETCH_NO_FAULT: %s", sc, strerror(rc));
	if ((rc = ibv_advise_mr(d1->pd, 7, 0, &sge, 1)) != EOPNOTSUPP)
		fail("%s: advice 7: %d, expected EOPNOTSUPP", sc, rc);

	make_pair(&a, d0, &b, d1);
	sge = (struct ibv_sge){ (uintptr_t)b.buf, 64, b.mr->lkey };
	if ((rc = ibv_advise_mr(d1->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1)) != EINVAL)
		fail("%s: prefetch of a pinned region: %d, expected EINVAL", sc, rc);
	memcpy(a.buf, "on demand", 9);
	/* The last page was never touched: the WRITE faults it in. */
	rc = post_send(&a, IBV_WR_RDMA_WRITE, 101, 9, (uintptr_t)(area + 3 * 4096 + 100),
		       odp->rkey);
	if (must_post(sc, "WRITE into an on-demand region", rc))
		expect_wc(sc, "requester", &a, 101, IBV_WC_SUCCESS, POLL_MS);
	if (memcmp(area + 3 * 4096 + 100, "on demand", 9))
		fail("%s: the WRITE did not land in the untouched page", sc);

	/* Implicit: one lkey for any buffer of the process. */
	refused = ibv_reg_mr(d0->pd, NULL, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE);
	if (refused || errno != EINVAL)
		fail("%s: implicit registration without ON_DEMAND: %s, expected EINVAL", sc,
		     refused ? "registered" : strerror(errno));
	implicit = ibv_reg_mr(d0->pd, NULL, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	if (!implicit) {
		fail("%s: implicit ODP: %s", sc, strerror(errno));
	} else {
		static char anywhere[32] = "from anywhere";
		struct ibv_sge s = { (uintptr_t)anywhere, 14, implicit->lkey };
		struct ibv_send_wr wr = { .wr_id = 102, .sg_list = &s, .num_sge = 1,
					  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
		struct ibv_send_wr *bad;

		must_post(sc, "recv", post_recv(&b, 103, 64));
		must_post(sc, "SEND through the implicit region", ibv_post_send(a.qp, &wr, &bad));
		expect_wc(sc, "sender", &a, 102, IBV_WC_SUCCESS, POLL_MS);
		expect_wc(sc, "receiver", &b, 103, IBV_WC_SUCCESS, POLL_MS);
		if (memcmp(b.buf, "from anywhere", 14))
			fail("%s: the implicit region's SEND brought \"%.14s\"", sc, b.buf);
	}
	ep_destroy(&a);
	ep_destroy(&b);
	if (implicit && ibv_dereg_mr(implicit))
		fail("%s: ibv_dereg_mr(implicit)", sc);
	if (ibv_dereg_mr(odp))
		fail("%s: ibv_dereg_mr(odp)", sc);
	munmap(area, len);
}

/*
 * p. thread and parent domains (ibv_alloc_td(3), ibv_alloc_parent_domain(3)): a parent domain
 *    over d1's PD with a thread domain carries an RC QP and an extended CQ
 *    (IBV_CQ_INIT_ATTR_MASK_PD) whose SEND traffic completes; while it lives its PD cannot be
 *    deallocated, nor its thread domain, and while the QP and CQ live it cannot be either (all
 *    EBUSY); afterwards all three go. A thread domain with a comp_mask, a parent domain over
 *    a parent domain and an extended CQ naming a plain PD as its parent domain are EINVAL.
 */
static void scenario_parent_domain(struct dev *d0, struct dev *d1)
{
	const char *sc = "parent_domain";
	struct ibv_td_init_attr td_attr = { 0 };
	struct ibv_parent_domain_init_attr pa = { 0 };
	struct ibv_cq_init_attr_ex ca = { .cqe = CQ_DEPTH, .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD };
	struct ibv_pd *parent, *nested, *plain_pd;
	struct ibv_cq_ex *cqx;
	struct ibv_td *td;
	struct ep a, b;
	int rc;

	td_attr.comp_mask = 1;
	td = ibv_alloc_td(d1->ctx, &td_attr);
	if (td || errno != EINVAL)
		fail("%s: ibv_alloc_td with comp_mask 1: %s, expected EINVAL", sc,
		     td ? "made" : strerror(errno));
	td_attr.comp_mask = 0;
	td = ibv_alloc_td(d1->ctx, &td_attr);
	plain_pd = ibv_alloc_pd(d1->ctx);
	if (!td || !plain_pd)
		die("%s: ibv_alloc_td / ibv_alloc_pd: %s", sc, strerror(errno));
	pa.pd = plain_pd;
	pa.td = td;
	parent = ibv_alloc_parent_domain(d1->ctx, &pa);
	if (!parent)
		die("%s: ibv_alloc_parent_domain: %s", sc, strerror(errno));
	pa.pd = parent;
	pa.td = NULL;
	nested = ibv_alloc_parent_domain(d1->ctx, &pa);
	if (nested || errno != EINVAL)
		fail("%s: a parent domain over a parent domain: %s, expected EINVAL", sc,
		     nested ? "made" : strerror(errno));
	ca.parent_domain = plain_pd;
	cqx = ibv_create_cq_ex(d1->ctx, &ca);
	if (cqx || errno != EINVAL)
		fail("%s: CQ with a plain PD as parent domain: %s, expected EINVAL", sc,
		     cqx ? "made" : strerror(errno));
	ca.parent_domain = parent;
	cqx = ibv_create_cq_ex(d1->ctx, &ca);
	if (!cqx)
		die("%s: ibv_create_cq_ex in a parent domain: %s", sc, strerror(errno));

	/* b's QP and MR in the parent domain, on its extended CQ. */
	ep_create(&a, d0);
	memset(&b, 0, sizeof(b));
	b.cq = ibv_cq_ex_to_cq(cqx);
	{
		struct dev in_parent = *d1;

		in_parent.pd = parent;
		ep_attach(&b, &in_parent, NULL);
		b.dev = d1;
	}
	connect_pair(&a, &b);
	must_post(sc, "recv", post_recv(&b, 111, 64));
	must_post(sc, "send", post_send(&a, IBV_WR_SEND, 112, 16, 0, 0));
	expect_wc(sc, "sender", &a, 112, IBV_WC_SUCCESS, POLL_MS);
	expect_wc(sc, "receiver", &b, 111, IBV_WC_SUCCESS, POLL_MS);

	if ((rc = ibv_dealloc_pd(plain_pd)) != EBUSY)
		fail("%s: dealloc of the PD under a parent domain: %d, expected EBUSY", sc, rc);
	if ((rc = ibv_dealloc_td(td)) != EBUSY)
		fail("%s: dealloc of a thread domain in use: %d, expected EBUSY", sc, rc);
	if ((rc = ibv_dealloc_pd(parent)) != EBUSY)
		fail("%s: dealloc of a parent domain with a QP: %d, expected EBUSY", sc, rc);
	ep_destroy(&a);
	ep_destroy(&b);
	if ((rc = ibv_dealloc_pd(parent)))
		fail("%s: dealloc of the parent domain: %s", sc, strerror(rc));
	if ((rc = ibv_dealloc_td(td)))
		fail("%s: ibv_dealloc_td: %s", sc, strerror(rc));
	if ((rc = ibv_dealloc_pd(plain_pd)))
		fail("%s: dealloc of the PD: %s", sc, strerror(rc));
}

/*
 * q. device memory and translated regions (ibv_alloc_dm(3), ibv_reg_mr_iova(3)): the device
 *    reports max_dm_size; more than that is ENOMEM; copies in and out of device memory need
 *    4-byte aligned offsets and lengths (EINVAL otherwise); ibv_reg_dm_mr needs
 *    IBV_ACCESS_ZERO_BASED (EINVAL without) and makes a region addressed from 0: a peer's
 *    RDMA WRITE at offset 16 of it is what ibv_memcpy_from_dm reads at 16 of the device
 *    memory; ibv_free_dm is EBUSY while the region lives. A region registered with
 *    ibv_reg_mr_iova at IOVA 0x1000000 takes a WRITE addressed there into its buffer.
 */
static void scenario_dm(struct dev *d0, struct dev *d1)
{
	const char *sc = "dm";
	struct ibv_device_attr_ex dx;
	struct ibv_alloc_dm_attr da = { .length = 4096 };
	struct ibv_dm *dm, *too_big;
	struct ibv_mr *dmmr, *refused, *iova_mr;
	struct ep a, b;
	char got[16];
	int rc;

	if (ibv_query_device_ex(d1->ctx, NULL, &dx) || !dx.max_dm_size) {
		fail("%s: no device memory reported", sc);
		return;
	}
	da.length = dx.max_dm_size + 4;
	too_big = ibv_alloc_dm(d1->ctx, &da);
	if (too_big || errno != ENOMEM)
		fail("%s: past max_dm_size: %s, expected ENOMEM", sc, too_big ? "made" : strerror(errno));
	da.length = 4096;
	dm = ibv_alloc_dm(d1->ctx, &da);
	if (!dm)
		die("%s: ibv_alloc_dm: %s", sc, strerror(errno));
	if ((rc = ibv_memcpy_to_dm(dm, 2, "abcd", 4)) != EINVAL)
		fail("%s: copy at an unaligned offset: %d, expected EINVAL", sc, rc);
	if ((rc = ibv_memcpy_to_dm(dm, 0, "abcdefgh", 8)))
		fail("%s: ibv_memcpy_to_dm: %s", sc, strerror(rc));
	if ((rc = ibv_memcpy_from_dm(got, dm, 4, 4)) || memcmp(got, "efgh", 4))
		fail("%s: ibv_memcpy_from_dm: %d \"%.4s\"", sc, rc, got);
	refused = ibv_reg_dm_mr(d1->pd, dm, 0, 4096, IBV_ACCESS_LOCAL_WRITE);
	if (refused || errno != EINVAL)
		fail("%s: ibv_reg_dm_mr without ZERO_BASED: %s, expected EINVAL", sc,
		     refused ? "made" : strerror(errno));
	dmmr = ibv_reg_dm_mr(d1->pd, dm, 0, 4096,
			     IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!dmmr)
		die("%s: ibv_reg_dm_mr: %s", sc, strerror(errno));
	make_pair(&a, d0, &b, d1);
	memcpy(a.buf, "into device mem!", 16);
	rc = post_send(&a, IBV_WR_RDMA_WRITE, 121, 16, 16, dmmr->rkey);
	if (must_post(sc, "WRITE into device memory", rc))
		expect_wc(sc, "requester", &a, 121, IBV_WC_SUCCESS, POLL_MS);
	if ((rc = ibv_memcpy_from_dm(got, dm, 16, 16)) || memcmp(got, "into device mem!", 16))
		fail("%s: device memory at 16 after the WRITE: %d \"%.16s\"", sc, rc, got);
	if ((rc = ibv_free_dm(dm)) != EBUSY)
		fail("%s: ibv_free_dm with a region: %d, expected EBUSY", sc, rc);

	iova_mr = ibv_reg_mr_iova(d1->pd, b.buf + 2048, 1024, 0x1000000,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!iova_mr) {
		fail("%s: ibv_reg_mr_iova: %s", sc, strerror(errno));
	} else {
		memcpy(a.buf, "by its IOVA", 11);
		rc = post_send(&a, IBV_WR_RDMA_WRITE, 122, 11, 0x1000000 + 8, iova_mr->rkey);
		if (must_post(sc, "WRITE by IOVA", rc))
			expect_wc(sc, "requester", &a, 122, IBV_WC_SUCCESS, POLL_MS);
		if (memcmp(b.buf + 2048 + 8, "by its IOVA", 11))
			fail("%s: the WRITE by IOVA did not land at the buffer's offset 8", sc);
		if (ibv_dereg_mr(iova_mr))
			fail("%s: ibv_dereg_mr(iova)", sc);
	}
	ep_destroy(&a);
	ep_destroy(&b);
	if (ibv_dereg_mr(dmmr))
		fail("%s: ibv_dereg_mr(dm)", sc);
	if ((rc = ibv_free_dm(dm)))
		fail("%s: ibv_free_dm: %s", sc, strerror(rc));
}

/* Posts one SEND of len bytes from e's buffer to the XRC SRQ srqn at the target. */
static int post_xrc_send(struct ep *e, uint64_t wr_id, uint32_t len, uint32_t srqn)
{
	struct ibv_sge sge = { .addr = (uintptr_t)e->buf, .length = len, .lkey = e->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;

	wr.qp_type.xrc.remote_srqn = srqn;
	return ibv_post_send(e->qp, &wr, &bad);
}

static void scenario_xrc(struct dev *d0, struct dev *d1)
{
	const char *sc = "xrc";
	char path[] = "/tmp/verbs_errors_xrcd_XXXXXX";
	struct ibv_xrcd_init_attr xa = { .comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS };
	struct ibv_xrcd *x, *again, *excl;
	struct ibv_srq_init_attr_ex sa;
	struct ibv_qp_init_attr_ex qa;
	struct ibv_qp_open_attr oa;
	struct ibv_recv_wr rwr, *bad_rwr;
	struct ibv_sge rsge;
	struct ibv_srq *srq;
	struct ibv_qp *opened;
	struct ibv_cq *srq_cq;
	struct ibv_mr *rmr;
	struct ep ini, tgt;
	struct ibv_wc wc;
	uint32_t srqn = 0;
	char *rbuf;
	int fd, rc;

	fd = mkstemp(path);
	if (fd < 0)
		die("%s: mkstemp: %s", sc, strerror(errno));
	xa.fd = fd;
	xa.oflags = 0;
	x = ibv_open_xrcd(d1->ctx, &xa);
	if (x || errno != EINVAL)
		fail("%s: a file with no domain, without O_CREAT: %s, expected EINVAL", sc,
		     x ? "opened" : strerror(errno));
	xa.oflags = O_CREAT;
	x = ibv_open_xrcd(d1->ctx, &xa);
	if (!x) {
		fail("%s: ibv_open_xrcd: %s", sc, strerror(errno));
		close(fd);
		unlink(path);
		return;
	}
	again = ibv_open_xrcd(d1->ctx, &xa);
	if (!again)
		fail("%s: the file's domain opened again: %s", sc, strerror(errno));
	xa.oflags = O_CREAT | O_EXCL;
	excl = ibv_open_xrcd(d1->ctx, &xa);
	if (excl || errno != EINVAL)
		fail("%s: O_EXCL on a file with a domain: %s, expected EINVAL", sc,
		     excl ? "opened" : strerror(errno));
	if (again && (rc = ibv_close_xrcd(again)))
		fail("%s: closing the second open: %s", sc, strerror(rc));

	srq_cq = ibv_create_cq(d1->ctx, CQ_DEPTH, NULL, NULL, 0);
	memset(&sa, 0, sizeof(sa));
	sa.attr.max_wr = 4;
	sa.attr.max_sge = 1;
	sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
		       IBV_SRQ_INIT_ATTR_CQ;
	sa.srq_type = IBV_SRQT_XRC;
	sa.pd = d1->pd;
	sa.xrcd = x;
	sa.cq = srq_cq;
	srq = srq_cq ? ibv_create_srq_ex(d1->ctx, &sa) : NULL;
	if (!srq)
		die("%s: ibv_create_srq_ex(XRC): %s", sc, strerror(errno));
	if ((rc = ibv_get_srq_num(srq, &srqn)) || !srqn)
		fail("%s: ibv_get_srq_num: %d, number %u", sc, rc, srqn);

	/* The target: a QP of the domain, nothing else. */
	memset(&tgt, 0, sizeof(tgt));
	tgt.dev = d1;
	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_XRC_RECV;
	qa.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	qa.xrcd = x;
	tgt.qp = ibv_create_qp_ex(d1->ctx, &qa);
	if (!tgt.qp)
		die("%s: ibv_create_qp_ex(XRC_RECV): %s", sc, strerror(errno));
	tgt.psn = (tgt.qp->qp_num * 2654435761u) & 0xffffff;

	/* The initiator: a send queue, its CQ and a buffer. */
	memset(&ini, 0, sizeof(ini));
	ini.dev = d0;
	ini.cq = ibv_create_cq(d0->ctx, CQ_DEPTH, NULL, NULL, 0);
	ini.buf = aligned_alloc(4096, BUF_SIZE);
	if (!ini.cq || !ini.buf)
		die("%s: initiator CQ or buffer", sc);
	memcpy(ini.buf, "to the XRC SRQ", 14);
	ini.mr = ibv_reg_mr(d0->pd, ini.buf, BUF_SIZE, MR_ACCESS);
	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_XRC_SEND;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD;
	qa.pd = d0->pd;
	qa.send_cq = ini.cq;
	qa.cap.max_send_wr = 8;
	qa.cap.max_send_sge = 1;
	ini.qp = ini.mr ? ibv_create_qp_ex(d0->ctx, &qa) : NULL;
	if (!ini.qp)
		die("%s: ibv_create_qp_ex(XRC_SEND): %s", sc, strerror(errno));
	ini.psn = (ini.qp->qp_num * 2654435761u) & 0xffffff;
	connect_qp(&ini, &d1->gid, tgt.qp->qp_num, tgt.psn, 14, 7);
	connect_qp(&tgt, &d0->gid, ini.qp->qp_num, ini.psn, 14, 7);

	/* The receive, in the SRQ; none in either half. */
	rbuf = aligned_alloc(4096, BUF_SIZE);
	memset(rbuf, 0, BUF_SIZE);
	rmr = ibv_reg_mr(d1->pd, rbuf, BUF_SIZE, MR_ACCESS);
	if (!rmr)
		die("%s: ibv_reg_mr: %s", sc, strerror(errno));
	rsge = (struct ibv_sge){ .addr = (uintptr_t)rbuf, .length = 64, .lkey = rmr->lkey };
	rwr = (struct ibv_recv_wr){ .wr_id = 131, .sg_list = &rsge, .num_sge = 1 };
	if ((rc = ibv_post_srq_recv(srq, &rwr, &bad_rwr)))
		fail("%s: ibv_post_srq_recv: %s", sc, strerror(rc));
	if ((rc = ibv_post_recv(tgt.qp, &rwr, &bad_rwr)) != EINVAL)
		fail("%s: ibv_post_recv on the target: %d, expected EINVAL", sc, rc);
	if ((rc = ibv_post_recv(ini.qp, &rwr, &bad_rwr)) != EINVAL)
		fail("%s: ibv_post_recv on the initiator: %d, expected EINVAL", sc, rc);

	/* Another handle to the target, destroyed again: the target serves on. */
	memset(&oa, 0, sizeof(oa));
	oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	oa.qp_num = tgt.qp->qp_num;
	oa.xrcd = x;
	oa.qp_type = IBV_QPT_XRC_RECV;
	opened = ibv_open_qp(d1->ctx, &oa);
	if (!opened || opened->qp_num != tgt.qp->qp_num)
		fail("%s: ibv_open_qp: %s", sc, opened ? "another QP" : strerror(errno));
	if (opened && (rc = ibv_destroy_qp(opened)))
		fail("%s: destroying the opened handle: %s", sc, strerror(rc));

	rc = post_xrc_send(&ini, 132, 14, srqn);
	if (must_post(sc, "SEND to the XRC SRQ", rc)) {
		expect_wc(sc, "initiator", &ini, 132, IBV_WC_SUCCESS, POLL_MS);
		if (poll_one(srq_cq, &wc, POLL_MS) != 1)
			fail("%s: no receive completion on the SRQ's CQ", sc);
		else if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 131 || wc.byte_len != 14 ||
			 wc.qp_num != tgt.qp->qp_num || memcmp(rbuf, "to the XRC SRQ", 14))
			fail("%s: receive: %s wr_id %" PRIu64 " len %u qp 0x%06x (target 0x%06x)",
			     sc, ibv_wc_status_str(wc.status), wc.wr_id, wc.byte_len, wc.qp_num,
			     tgt.qp->qp_num);
		else
			printf("%s: receive on the SRQ's CQ through target 0x%06x\n", sc, wc.qp_num);
	}
	if ((rc = ibv_close_xrcd(x)) != EBUSY)
		fail("%s: closing the domain with its SRQ and target: %d, expected EBUSY", sc, rc);

	rc = post_xrc_send(&ini, 133, 8, srqn + 1000);
	if (must_post(sc, "SEND to an SRQ the domain lacks", rc))
		expect_wc(sc, "initiator", &ini, 133, IBV_WC_REM_INV_REQ_ERR, POLL_MS);

	if ((rc = ibv_destroy_srq(srq)))
		fail("%s: ibv_destroy_srq: %s", sc, strerror(rc));
	if ((rc = ibv_destroy_qp(tgt.qp)))
		fail("%s: destroying the target: %s", sc, strerror(rc));
	if ((rc = ibv_close_xrcd(x)))
		fail("%s: ibv_close_xrcd: %s", sc, strerror(rc));
	ep_destroy(&ini);
	ibv_destroy_cq(srq_cq);
	ibv_dereg_mr(rmr);
	free(rbuf);
	close(fd);
	unlink(path);
}

static void scenario_import(struct dev *d0, struct dev *d1)
{
	const char *sc = "import";
	struct ibv_alloc_dm_attr da = { .length = 256 };
	struct ibv_context *ctx2, *stray;
	struct ibv_pd *pd2, *bad_pd;
	struct ibv_mr *mr, *mr2;
	struct ibv_dm *dm, *dm2;
	struct dev d2;
	struct ep a, b;
	char got[8], *buf;
	int fd, rc;

	fd = open("/dev/null", O_RDWR);
	stray = ibv_import_device(fd);
	if (stray || errno != EOPNOTSUPP)
		fail("%s: importing /dev/null: %s, expected EOPNOTSUPP", sc,
		     stray ? "imported" : strerror(errno));
	if (!stray)
		close(fd);
	ctx2 = ibv_import_device(dup(d1->ctx->cmd_fd));
	if (!ctx2) {
		fail("%s: ibv_import_device: %s", sc, strerror(errno));
		return;
	}
	pd2 = ibv_import_pd(ctx2, d1->pd->handle);
	if (!pd2 || pd2->handle != d1->pd->handle)
		die("%s: ibv_import_pd: %s", sc, pd2 ? "another handle" : strerror(errno));
	bad_pd = ibv_import_pd(ctx2, 0xdead);
	if (bad_pd || errno != EINVAL)
		fail("%s: an unknown PD handle: %s, expected EINVAL", sc, bad_pd ? "imported" : strerror(errno));

	buf = aligned_alloc(4096, BUF_SIZE);
	memset(buf, 0, BUF_SIZE);
	mr = ibv_reg_mr(d1->pd, buf, BUF_SIZE, MR_ACCESS);
	mr2 = mr ? ibv_import_mr(pd2, mr->handle) : NULL;
	if (!mr2)
		die("%s: ibv_import_mr: %s", sc, strerror(errno));
	if (mr2->lkey != mr->lkey || mr2->rkey != mr->rkey || mr2->addr != mr->addr ||
	    mr2->length != mr->length || mr2->pd != pd2)
		fail("%s: the imported region differs: keys %#x/%#x, %p+%zu", sc, mr2->lkey,
		     mr2->rkey, mr2->addr, mr2->length);

	dm = ibv_alloc_dm(d1->ctx, &da);
	dm2 = dm ? ibv_import_dm(ctx2, dm->handle) : NULL;
	if (!dm2) {
		fail("%s: ibv_import_dm: %s", sc, strerror(errno));
	} else {
		if ((rc = ibv_memcpy_to_dm(dm, 8, "shared!!", 8)))
			fail("%s: ibv_memcpy_to_dm: %s", sc, strerror(rc));
		if ((rc = ibv_memcpy_from_dm(got, dm2, 8, 8)) || memcmp(got, "shared!!", 8))
			fail("%s: the imported device memory: %d \"%.8s\"", sc, rc, got);
		ibv_unimport_dm(dm2);
	}

	/* A QP of the imported context and PD, written into through the imported region's key. */
	d2 = *d1;
	d2.ctx = ctx2;
	d2.pd = pd2;
	d2.name = "imported";
	make_pair(&a, d0, &b, &d2);
	memcpy(a.buf, "through the import", 18);
	rc = post_send(&a, IBV_WR_RDMA_WRITE, 141, 18, (uintptr_t)buf + 64, mr2->rkey);
	if (must_post(sc, "WRITE into the imported region", rc))
		expect_wc(sc, "requester", &a, 141, IBV_WC_SUCCESS, POLL_MS);
	if (memcmp(buf + 64, "through the import", 18))
		fail("%s: the WRITE left \"%.18s\"", sc, buf + 64);
	ep_destroy(&a);
	ep_destroy(&b);

	ibv_unimport_mr(mr2);
	ibv_unimport_pd(pd2);
	if ((rc = ibv_close_device(ctx2)))
		fail("%s: closing the imported context: %s", sc, strerror(rc));
	/* The originals are untouched. */
	if (dm && (rc = ibv_memcpy_from_dm(got, dm, 8, 8)) == 0 && memcmp(got, "shared!!", 8))
		fail("%s: the device memory changed", sc);
	if (dm && (rc = ibv_free_dm(dm)))
		fail("%s: ibv_free_dm: %s", sc, strerror(rc));
	if ((rc = ibv_dereg_mr(mr)))
		fail("%s: ibv_dereg_mr of the original: %s", sc, strerror(rc));
	free(buf);
}

/* Waits for the next completion of an extended CQ: 0 with it loaded, else the poll's error. */
static int tm_next(struct ibv_cq_ex *cq)
{
	return start_poll_wait(cq);
}

/* Checks the loaded completion of a TM-SRQ's CQ, then ends the poll. */
static void tm_expect(const char *sc, const char *what, struct ibv_cq_ex *cq, uint64_t wr_id,
		      enum ibv_wc_opcode op, unsigned int flags, uint64_t tag, uint32_t len)
{
	struct ibv_wc_tm_info info = { 0 };
	unsigned int got_flags;
	int rc = tm_next(cq);

	if (rc) {
		fail("%s: %s: no completion (%d)", sc, what, rc);
		return;
	}
	got_flags = ibv_wc_read_wc_flags(cq) & (IBV_WC_TM_SYNC_REQ | IBV_WC_TM_MATCH |
						 IBV_WC_TM_DATA_VALID);
	ibv_wc_read_tm_info(cq, &info);
	printf("%s: %s %s opcode %d flags 0x%x tag 0x%" PRIx64 "\n", sc, what,
	       ibv_wc_status_str(cq->status), ibv_wc_read_opcode(cq), got_flags,
	       (uint64_t)info.tag);
	if (cq->status != IBV_WC_SUCCESS || cq->wr_id != wr_id ||
	    ibv_wc_read_opcode(cq) != op || got_flags != flags || info.tag != tag ||
	    ((op == IBV_WC_TM_RECV || op == IBV_WC_TM_NO_TAG) && ibv_wc_read_byte_len(cq) != len))
		fail("%s: %s: status %d wr_id %" PRIu64 " opcode %d flags 0x%x tag 0x%" PRIx64
		     " len %u; expected wr_id %" PRIu64 " opcode %d flags 0x%x tag 0x%" PRIx64
		     " len %u",
		     sc, what, cq->status, (uint64_t)cq->wr_id, ibv_wc_read_opcode(cq), got_flags,
		     (uint64_t)info.tag, ibv_wc_read_byte_len(cq), wr_id, op, flags, tag, len);
	ibv_end_poll(cq);
}

/* A TMH (`op`, `tag`, context 0x5a) then `body_len` bytes of pattern at the start of a's buffer. */
static uint32_t tm_message(struct ep *a, uint8_t op, uint64_t tag, uint32_t body_len)
{
	struct ibv_tmh tmh = { .opcode = op, .app_ctx = htonl(0x5a), .tag = htobe64(tag) };

	memcpy(a->buf, &tmh, sizeof(tmh));
	for (uint32_t i = 0; i < body_len; i++)
		a->buf[sizeof(tmh) + i] = (char)(i * 7 + op);
	return sizeof(tmh) + body_len;
}

static struct ibv_ops_wr tm_add(uint64_t wr_id, uint64_t tag, struct ibv_sge *sge)
{
	struct ibv_ops_wr op = { .wr_id = wr_id, .opcode = IBV_WR_TAG_ADD,
				 .flags = IBV_OPS_SIGNALED };

	op.tm.add.recv_wr_id = tag;
	op.tm.add.sg_list = sge;
	op.tm.add.num_sge = 1;
	op.tm.add.tag = tag;
	op.tm.add.mask = ~0ull;
	return op;
}

static void scenario_tm(struct dev *d0, struct dev *d1)
{
	const char *sc = "tm";
	const unsigned int all = IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID;
	struct ibv_cq_init_attr_ex ca = { .cqe = CQ_DEPTH,
					  .wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_TM_INFO };
	struct ibv_srq_init_attr_ex sa;
	struct ibv_device_attr_ex dx;
	struct ibv_ops_wr op, *bad_op;
	struct ibv_recv_wr rwr, *bad_rwr;
	struct ibv_sge sge, rsge[2];
	struct ibv_cq_ex *cqx;
	struct ibv_srq *srq;
	struct ibv_rvh rvh;
	struct ep a, b;
	char *data;
	uint32_t len;
	int rc;

	if (ibv_query_device_ex(d1->ctx, NULL, &dx) || !(dx.tm_caps.flags & IBV_TM_CAP_RC)) {
		printf("%s: the device has no RC tag matching; skipped\n", sc);
		return;
	}
	printf("%s: tm_caps max_num_tags %u max_ops %u max_sge %u max_rndv_hdr_size %u\n", sc,
	       dx.tm_caps.max_num_tags, dx.tm_caps.max_ops, dx.tm_caps.max_sge,
	       dx.tm_caps.max_rndv_hdr_size);
	cqx = ibv_create_cq_ex(d1->ctx, &ca);
	if (!cqx)
		die("%s: ibv_create_cq_ex(TM_INFO): %s", sc, strerror(errno));
	memset(&sa, 0, sizeof(sa));
	sa.attr.max_wr = 8;
	sa.attr.max_sge = 1;
	sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TM;
	sa.srq_type = IBV_SRQT_TM;
	sa.pd = d1->pd;
	sa.tm_cap.max_num_tags = dx.tm_caps.max_num_tags;
	sa.tm_cap.max_ops = 8;
	srq = ibv_create_srq_ex(d1->ctx, &sa);
	if (srq || errno != EINVAL)
		fail("%s: a TM-SRQ without its CQ: %s, expected EINVAL", sc,
		     srq ? "created" : strerror(errno));
	sa.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
	sa.cq = ibv_cq_ex_to_cq(cqx);
	srq = ibv_create_srq_ex(d1->ctx, &sa);
	if (!srq)
		die("%s: ibv_create_srq_ex(TM): %s", sc, strerror(errno));

	ep_create(&a, d0);
	memset(&b, 0, sizeof(b));
	b.cq = ibv_cq_ex_to_cq(cqx);
	ep_attach(&b, d1, srq);
	connect_pair(&a, &b);

	/* Two ordinary SRQ buffers (the first half of b's buffer), one tag (the third quarter). */
	for (int i = 0; i < 2; i++) {
		rsge[i] = (struct ibv_sge){ (uintptr_t)b.buf + i * 1024, 1024, b.mr->lkey };
		rwr = (struct ibv_recv_wr){ .wr_id = 100 + i, .sg_list = &rsge[i], .num_sge = 1 };
		must_post(sc, "SRQ receive", ibv_post_srq_recv(srq, &rwr, &bad_rwr));
	}
	sge = (struct ibv_sge){ (uintptr_t)b.buf + 2048, 1024, b.mr->lkey };
	op = tm_add(1, 0x42, &sge);
	must_post(sc, "ADD 0x42", ibv_post_srq_ops(srq, &op, &bad_op));
	tm_expect(sc, "ADD", cqx, 1, IBV_WC_TM_ADD, 0, 0, 0);

	/* Expected: the tag's buffer, without the TMH. */
	len = tm_message(&a, IBV_TMH_EAGER, 0x42, 48);
	must_post(sc, "eager 0x42", post_send(&a, IBV_WR_SEND, 10, len, 0, 0));
	expect_wc(sc, "sender", &a, 10, IBV_WC_SUCCESS, POLL_MS);
	tm_expect(sc, "matched", cqx, 0x42, IBV_WC_TM_RECV, all, 0x42, 48);
	if (memcmp(b.buf + 2048, a.buf + sizeof(struct ibv_tmh), 48))
		fail("%s: the matched payload is not in the tag's buffer", sc);

	/* Unexpected: whole, into the first SRQ buffer; then the count is reported. */
	len = tm_message(&a, IBV_TMH_EAGER, 0x99, 48);
	must_post(sc, "eager 0x99", post_send(&a, IBV_WR_SEND, 11, len, 0, 0));
	expect_wc(sc, "sender", &a, 11, IBV_WC_SUCCESS, POLL_MS);
	tm_expect(sc, "unexpected", cqx, 100, IBV_WC_TM_RECV, 0, 0, len);
	if (memcmp(b.buf, a.buf, len))
		fail("%s: the unexpected message is not whole in the SRQ buffer", sc);
	op = (struct ibv_ops_wr){ .wr_id = 2, .opcode = IBV_WR_TAG_SYNC,
				  .flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC };
	op.tm.unexpected_cnt = 1;
	must_post(sc, "SYNC 1", ibv_post_srq_ops(srq, &op, &bad_op));
	tm_expect(sc, "SYNC", cqx, 2, IBV_WC_TM_SYNC, 0, 0, 0);

	/* NO_TAG: whole, into the second SRQ buffer. */
	len = tm_message(&a, IBV_TMH_NO_TAG, 0, 8);
	must_post(sc, "no tag", post_send(&a, IBV_WR_SEND, 12, len, 0, 0));
	expect_wc(sc, "sender", &a, 12, IBV_WC_SUCCESS, POLL_MS);
	tm_expect(sc, "no tag", cqx, 101, IBV_WC_TM_NO_TAG, 0, 0, len);

	/* Rendezvous: the data (1000 bytes at a.buf + 2048) is READ into the tag's buffer. */
	op = tm_add(3, 0x43, &sge);
	must_post(sc, "ADD 0x43", ibv_post_srq_ops(srq, &op, &bad_op));
	tm_expect(sc, "ADD", cqx, 3, IBV_WC_TM_ADD, 0, 0, 0);
	data = a.buf + 2048;
	for (int i = 0; i < 1000; i++)
		data[i] = (char)(i * 13 + 1);
	len = tm_message(&a, IBV_TMH_RNDV, 0x43, 0);
	rvh = (struct ibv_rvh){ .va = htobe64((uintptr_t)data), .rkey = htonl(a.mr->rkey),
				.len = htonl(1000) };
	memcpy(a.buf + len, &rvh, sizeof(rvh));
	len += sizeof(rvh);
	{
		/* The FIN comes back into a's receive queue, at a.buf + 1024. */
		struct ibv_sge fsge = { (uintptr_t)a.buf + 1024, 64, a.mr->lkey };
		struct ibv_recv_wr fwr = { .wr_id = 55, .sg_list = &fsge, .num_sge = 1 };

		must_post(sc, "FIN receive", ibv_post_recv(a.qp, &fwr, &bad_rwr));
	}
	must_post(sc, "rendezvous 0x43", post_send(&a, IBV_WR_SEND, 13, len, 0, 0));
	expect_wc(sc, "sender", &a, 13, IBV_WC_SUCCESS, POLL_MS);
	tm_expect(sc, "rendezvous match", cqx, 0x43, IBV_WC_TM_RECV, IBV_WC_TM_MATCH, 0x43, 0);
	tm_expect(sc, "rendezvous data", cqx, 0x43, IBV_WC_TM_RECV, IBV_WC_TM_DATA_VALID, 0,
		  1000);
	if (memcmp(b.buf + 2048, data, 1000))
		fail("%s: the rendezvous data is not in the tag's buffer", sc);
	expect_wc(sc, "FIN", &a, 55, IBV_WC_SUCCESS, POLL_MS);
	if (((struct ibv_tmh *)(a.buf + 1024))->opcode != IBV_TMH_FIN ||
	    memcmp(a.buf + 1024 + 1, a.buf + 1, len - 1))
		fail("%s: the FIN is not the request's headers with the FIN opcode", sc);

	/* A handle never added. */
	op = (struct ibv_ops_wr){ .wr_id = 4, .opcode = IBV_WR_TAG_DEL, .flags = IBV_OPS_SIGNALED };
	op.tm.handle = 999;
	bad_op = NULL;
	rc = ibv_post_srq_ops(srq, &op, &bad_op);
	if (rc != EINVAL || bad_op != &op)
		fail("%s: DEL of handle 999: %d, bad_op %s; expected EINVAL naming it", sc, rc,
		     bad_op == &op ? "set" : "not set");

	ep_destroy(&a);
	if (ibv_destroy_qp(b.qp))
		fail("%s: cleanup: ibv_destroy_qp", sc);
	if (ibv_destroy_srq(srq))
		fail("%s: cleanup: ibv_destroy_srq", sc);
	if (ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)))
		fail("%s: cleanup: ibv_destroy_cq", sc);
	if (ibv_dereg_mr(b.mr))
		fail("%s: cleanup: ibv_dereg_mr", sc);
	free(b.buf);
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_device *ib0 = NULL, *ib1 = NULL;
	struct dev d0, d1;
	int n = -1;

	/* ibv_get_device_list(3) always sets the count. */
	list = ibv_get_device_list(&n);
	if (!list)
		die("ibv_get_device_list: %s", strerror(errno));
	if (n < 0)
		die("ibv_get_device_list left the device count unset");
	for (int i = 0; i < n; i++) {
		const char *name = ibv_get_device_name(list[i]);

		if (!strcmp(name, "uroce0"))
			ib0 = list[i];
		else if (!strcmp(name, "uroce1"))
			ib1 = list[i];
	}
	/* Not on uroce: take the first two devices. */
	if ((!ib0 || !ib1) && n >= 2) {
		ib0 = list[0];
		ib1 = list[1];
	}
	if (!ib0 || !ib1)
		die("need two RDMA devices, found %d (set UROCE_ADDR=127.0.0.2,127.0.0.3)", n);
	open_dev(&d0, ib0);
	open_dev(&d1, ib1);
	printf("devices: %s and %s\n", d0.name, d1.name);

	scenario_recv_too_small(&d0, &d1);
	scenario_bad_rkey(&d0, &d1);
	scenario_retry_exhaustion(&d0, &d1);
	scenario_flush(&d0, &d1);
	scenario_sync_failures(&d0);
	scenario_comp_channel(&d0, &d1);
	scenario_srq_limit(&d0, &d1);
	scenario_destroy_waits_for_ack(&d0, &d1);
	scenario_destroy_waits_for_async_ack(&d0, &d1);
	scenario_unmapped_after_registration(&d0, &d1);
	scenario_abi(&d0);
	scenario_checks(&d0, &d1);
	scenario_cq_ex(&d0, &d1);
	scenario_wr_api(&d0, &d1);
	scenario_mw(&d0, &d1);
	scenario_odp(&d0, &d1);
	scenario_parent_domain(&d0, &d1);
	scenario_dm(&d0, &d1);
	scenario_xrc(&d0, &d1);
	scenario_import(&d0, &d1);
	scenario_tm(&d0, &d1);

	close_dev(&d0);
	close_dev(&d1);
	ibv_free_device_list(list);

	if (failures) {
		printf("%d expectation(s) failed\n", failures);
		return 1;
	}
	printf("all expectations hold\n");
	return 0;
}
