/* Out-of-line copies of libfabric's static-inline calls. Nothing here adds behaviour. */
#include <stdlib.h>
#include <string.h>
#include "shim.h"

struct fi_info *dmafab_allocinfo(void) { return fi_allocinfo(); }

/* fi_freeinfo frees prov_name, so it must come from the C heap. */
int dmafab_set_provider_name(struct fi_info *info, const char *name)
{
	char *copy = strdup(name);
	if (!copy)
		return -FI_ENOMEM;
	free(info->fabric_attr->prov_name);
	info->fabric_attr->prov_name = copy;
	return 0;
}

int dmafab_set_fabric_name(struct fi_info *info, const char *name)
{
	char *copy = strdup(name);
	if (!copy)
		return -FI_ENOMEM;
	free(info->fabric_attr->name);
	info->fabric_attr->name = copy;
	return 0;
}

/* The API version these headers describe, which is what fi_getinfo must be asked for. */
uint32_t dmafab_version(void) { return FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION); }

int dmafab_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain, void *context)
{ return fi_domain(fabric, info, domain, context); }
int dmafab_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep, void *context)
{ return fi_endpoint(domain, info, ep, context); }
int dmafab_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av, void *context)
{ return fi_av_open(domain, attr, av, context); }
int dmafab_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq, void *context)
{ return fi_cq_open(domain, attr, cq, context); }
int dmafab_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags) { return fi_ep_bind(ep, bfid, flags); }
int dmafab_enable(struct fid_ep *ep) { return fi_enable(ep); }
int dmafab_close(struct fid *fid) { return fi_close(fid); }
int dmafab_getname(struct fid *fid, void *addr, size_t *addrlen) { return fi_getname(fid, addr, addrlen); }

int dmafab_av_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags, void *context)
{ return fi_av_insert(av, addr, count, fi_addr, flags, context); }
int dmafab_av_remove(struct fid_av *av, fi_addr_t *fi_addr, size_t count, uint64_t flags)
{ return fi_av_remove(av, fi_addr, count, flags); }
int dmafab_av_lookup(struct fid_av *av, fi_addr_t fi_addr, void *addr, size_t *addrlen)
{ return fi_av_lookup(av, fi_addr, addr, addrlen); }
const char *dmafab_av_straddr(struct fid_av *av, const void *addr, char *buf, size_t *len)
{ return fi_av_straddr(av, addr, buf, len); }

ssize_t dmafab_cq_read(struct fid_cq *cq, void *buf, size_t count) { return fi_cq_read(cq, buf, count); }
ssize_t dmafab_cq_readfrom(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src_addr)
{ return fi_cq_readfrom(cq, buf, count, src_addr); }
ssize_t dmafab_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags)
{ return fi_cq_readerr(cq, buf, flags); }
ssize_t dmafab_cq_sread(struct fid_cq *cq, void *buf, size_t count, const void *cond, int timeout)
{ return fi_cq_sread(cq, buf, count, cond, timeout); }
int dmafab_cq_signal(struct fid_cq *cq) { return fi_cq_signal(cq); }
const char *dmafab_cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data, char *buf, size_t len)
{ return fi_cq_strerror(cq, prov_errno, err_data, buf, len); }

ssize_t dmafab_send(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr, void *context)
{ return fi_send(ep, buf, len, desc, dest_addr, context); }
ssize_t dmafab_inject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest_addr)
{ return fi_inject(ep, buf, len, dest_addr); }
ssize_t dmafab_recv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, void *context)
{ return fi_recv(ep, buf, len, desc, src_addr, context); }
ssize_t dmafab_tsend(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr, uint64_t tag, void *context)
{ return fi_tsend(ep, buf, len, desc, dest_addr, tag, context); }
ssize_t dmafab_trecv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, uint64_t tag, uint64_t ignore, void *context)
{ return fi_trecv(ep, buf, len, desc, src_addr, tag, ignore, context); }

int dmafab_mr_reg(struct fid_domain *domain, const void *buf, size_t len, uint64_t access, uint64_t offset, uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context)
{ return fi_mr_reg(domain, buf, len, access, offset, requested_key, flags, mr, context); }
void *dmafab_mr_desc(struct fid_mr *mr) { return fi_mr_desc(mr); }
uint64_t dmafab_mr_key(struct fid_mr *mr) { return fi_mr_key(mr); }
int dmafab_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags) { return fi_mr_bind(mr, bfid, flags); }
int dmafab_mr_enable(struct fid_mr *mr) { return fi_mr_enable(mr); }
int dmafab_mr_regattr(struct fid_domain *domain, const struct fi_mr_attr *attr, uint64_t flags, struct fid_mr **mr)
{ return fi_mr_regattr(domain, attr, flags, mr); }

int dmafab_mr_reg_iface(struct fid_domain *domain, const void *buf, size_t len, uint64_t access, uint64_t requested_key, enum fi_hmem_iface iface, int device, struct fid_mr **mr)
{
	struct iovec iov = { .iov_base = (void *) buf, .iov_len = len };
	struct fi_mr_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.mr_iov = &iov;
	attr.iov_count = 1;
	attr.access = access;
	attr.requested_key = requested_key;
	attr.iface = iface;
	switch (iface) {
	case FI_HMEM_ZE:
		attr.device.ze = device;
		break;
	case FI_HMEM_NEURON:
		attr.device.neuron = device;
		break;
	default:
		attr.device.cuda = device;
		break;
	}
	return fi_mr_regattr(domain, &attr, 0, mr);
}

ssize_t dmafab_write(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr, uint64_t addr, uint64_t key, void *context)
{ return fi_write(ep, buf, len, desc, dest_addr, addr, key, context); }

ssize_t dmafab_writemsg(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags)
{ return fi_writemsg(ep, msg, flags); }

ssize_t dmafab_readmsg(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags)
{ return fi_readmsg(ep, msg, flags); }

ssize_t dmafab_writedata(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data, fi_addr_t dest_addr, uint64_t addr, uint64_t key, void *context)
{ return fi_writedata(ep, buf, len, desc, data, dest_addr, addr, key, context); }
ssize_t dmafab_read(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, uint64_t addr, uint64_t key, void *context)
{ return fi_read(ep, buf, len, desc, src_addr, addr, key, context); }
ssize_t dmafab_cancel(struct fid *fid, void *context) { return fi_cancel(fid, context); }

int dmafab_control(struct fid *fid, int command, void *arg) { return fi_control(fid, command, arg); }
int dmafab_trywait(struct fid_fabric *fabric, struct fid **fids, int count)
{ return fi_trywait(fabric, fids, count); }
