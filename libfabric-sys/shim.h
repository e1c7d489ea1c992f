/*
 * Out-of-line wrappers for libfabric's static-inline calls, which have no symbol to link
 * against. Each forwards its arguments unchanged; see shim.c.
 */
#ifndef DMA_LIBFABRIC_SHIM_H
#define DMA_LIBFABRIC_SHIM_H

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

struct fi_info *dmafab_allocinfo(void);
int dmafab_set_provider_name(struct fi_info *info, const char *name);
int dmafab_set_fabric_name(struct fi_info *info, const char *name);
uint32_t dmafab_version(void);

int dmafab_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain, void *context);
int dmafab_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep, void *context);
int dmafab_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av, void *context);
int dmafab_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq, void *context);
int dmafab_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags);
int dmafab_enable(struct fid_ep *ep);
int dmafab_close(struct fid *fid);
int dmafab_getname(struct fid *fid, void *addr, size_t *addrlen);

int dmafab_av_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags, void *context);
int dmafab_av_remove(struct fid_av *av, fi_addr_t *fi_addr, size_t count, uint64_t flags);
int dmafab_av_lookup(struct fid_av *av, fi_addr_t fi_addr, void *addr, size_t *addrlen);
const char *dmafab_av_straddr(struct fid_av *av, const void *addr, char *buf, size_t *len);

ssize_t dmafab_cq_read(struct fid_cq *cq, void *buf, size_t count);
ssize_t dmafab_cq_readfrom(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src_addr);
ssize_t dmafab_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags);
ssize_t dmafab_cq_sread(struct fid_cq *cq, void *buf, size_t count, const void *cond, int timeout);
int dmafab_cq_signal(struct fid_cq *cq);
const char *dmafab_cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data, char *buf, size_t len);

ssize_t dmafab_send(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr, void *context);
ssize_t dmafab_inject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest_addr);
ssize_t dmafab_recv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, void *context);
ssize_t dmafab_tsend(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr, uint64_t tag, void *context);
ssize_t dmafab_trecv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, uint64_t tag, uint64_t ignore, void *context);

int dmafab_mr_reg(struct fid_domain *domain, const void *buf, size_t len, uint64_t access, uint64_t offset, uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context);
void *dmafab_mr_desc(struct fid_mr *mr);
uint64_t dmafab_mr_key(struct fid_mr *mr);
int dmafab_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags);
int dmafab_mr_enable(struct fid_mr *mr);
int dmafab_mr_regattr(struct fid_domain *domain, const struct fi_mr_attr *attr, uint64_t flags, struct fid_mr **mr);
/* fi_mr_regattr of one buffer on interface `iface`, device `device`: the fi_mr_attr is built here,
 * because its layout differs between libfabric 1.x and 2.x (2.x puts mr_iov in a union). */
int dmafab_mr_reg_iface(struct fid_domain *domain, const void *buf, size_t len, uint64_t access, uint64_t requested_key, enum fi_hmem_iface iface, int device, struct fid_mr **mr);

ssize_t dmafab_write(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr, uint64_t addr, uint64_t key, void *context);
ssize_t dmafab_read(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, uint64_t addr, uint64_t key, void *context);
ssize_t dmafab_writemsg(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags);
ssize_t dmafab_readmsg(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags);
ssize_t dmafab_writedata(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data, fi_addr_t dest_addr, uint64_t addr, uint64_t key, void *context);
ssize_t dmafab_cancel(struct fid *fid, void *context);

int dmafab_control(struct fid *fid, int command, void *arg);
int dmafab_trywait(struct fid_fabric *fabric, struct fid **fids, int count);

#endif
