/*
 * nfsmount SERVER:/EXPORT DIR OPTIONS: mounts an NFS export with mount(2)
 * and text options, as mount.nfs does (busybox mount cannot mount NFS).
 * Built static at test time for the kernel NFS client suite's guest
 * (src/kernel/mod.rs).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: nfsmount SERVER:/EXPORT DIR OPTIONS\n");
		return 2;
	}
	if (mount(argv[1], argv[2], "nfs", 0, argv[3]) != 0) {
		fprintf(stderr, "nfsmount: mount %s on %s with %s: %s\n", argv[1],
			argv[2], argv[3], strerror(errno));
		return 1;
	}
	return 0;
}
