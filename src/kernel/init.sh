#!/bin/busybox sh
# /init of the kernel NFS client suite's guest (src/kernel/mod.rs).
#
# Loads the NFS client modules (@MODULES@ is replaced by them, in load
# order), mounts SERVER:EXPORT from the kernel command line
# (gvfs.server= gvfs.port= gvfs.mountport= gvfs.export=) with mount(2) and
# text options, runs a workload on it (with gvfs.set_mtime=1, also setting a
# file's mtime after writing it) and reports on the second serial port
# (/dev/ttyS1; the kernel's console is ttyS0), one line each:
#   gvfs-kernel: step NAME ok
#   gvfs-kernel: step NAME fail WHAT
#   gvfs-kernel: entry PATH file MODE UID GID SIZE NLINK MD5
#   gvfs-kernel: entry PATH dir MODE UID GID
#   gvfs-kernel: entry PATH symlink UID GID TARGET
#   gvfs-kernel: mtime PATH SECONDS      (a file whose mtime it set)
#   gvfs-kernel: end FAILED_STEPS
# and powers off. The entries list what is under the mount after the
# remount, every file's checksum checked by then against the copy the guest
# keeps in RAM.

export PATH=/bin
M=/mnt
# A step killed after this long ends the run (an NFS call that never
# returns would hang every step after it).
STEP_TIMEOUT=90

say() { echo "gvfs-kernel: $*" >&3; }
md5() { set -- $(md5sum "$1") && echo "$1"; }
# is GOT WANT
is() { [ "$1" = "$2" ] || { echo "got '$1', expected '$2'"; return 1; }; }
# same FILE EXPECTED: equal contents.
same() {
  a=$(md5 "$1") && b=$(md5 "$2") || return 1
  [ "$a" = "$b" ] || { echo "$1 has MD5 $a, expected $b ($(stat -c %s "$1") bytes, expected $(stat -c %s "$2"))"; return 1; }
}
drop() { sync && echo 3 > /proc/sys/vm/drop_caches; }
arg() { sed -n "s/.*gvfs\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
nfs_mount() {
  server=$(arg server)
  port=$(arg port)
  mountport=$(arg mountport)
  nfsmount "$server:$(arg export)" $M \
    "vers=3,proto=tcp,port=$port,mountport=$mountport,mountproto=tcp,nolock,addr=$server,mountaddr=$server"
}

create() {
  echo hello > $M/hello.txt && mkdir $M/dir && echo inner > $M/dir/inner && : > $M/empty
}
# Overwrites 70,000 bytes across the first 1 MiB boundary of big, and
# 5,000 bytes at an odd offset of odd, then appends to odd (in the file
# named and in the guest's own copy in /tmp).
patch() {
  dd if=/tmp/patch of=$1/big bs=1000 seek=1000 count=70 conv=notrunc 2>/dev/null &&
  dd if=/tmp/patch of=$1/odd bs=1 seek=123457 count=5000 conv=notrunc 2>/dev/null &&
  head -c 3000 /tmp/patch >> $1/odd
}
# Two writers and a reader at once.
parallel() {
  dd if=/tmp/big of=$M/par1 bs=64k 2>/dev/null & w1=$!
  dd if=/tmp/odd of=$M/par2 bs=32k 2>/dev/null & w2=$!
  same $M/big /tmp/big; read_rc=$?
  wait $w1 && wait $w2 && [ $read_rc = 0 ] && drop && same $M/par1 /tmp/big && same $M/par2 /tmp/odd
}
rename() {
  mv $M/hello.txt $M/renamed.txt && [ ! -e $M/hello.txt ] && is "$(cat $M/renamed.txt)" hello
}
rename_over() {
  echo one > $M/r1 && echo two > $M/r2 && mv -f $M/r1 $M/r2 && [ ! -e $M/r1 ] && is "$(cat $M/r2)" one
}
move_dir() {
  mkdir $M/sub && echo deep > $M/sub/deep && mv $M/sub $M/dir/sub && is "$(cat $M/dir/sub/deep)" deep
}
hardlink() {
  ln $M/big $M/big.link && is "$(stat -c %h $M/big)" 2 && same $M/big.link /tmp/big
}
symlink() {
  ln -s big $M/big.sym && is "$(readlink $M/big.sym)" big && same $M/big.sym /tmp/big
}
unlink_link() {
  ln $M/odd $M/odd.link && is "$(stat -c %h $M/odd)" 2 && rm $M/odd.link && is "$(stat -c %h $M/odd)" 1
}
# Copies big, cuts it to 2,500,000 bytes, then extends it to 3,000,000:
# the end must read as zeros, not as the bytes cut off.
truncate_() {
  cp /tmp/big $M/trunc && truncate -s 2500000 $M/trunc && truncate -s 3000000 $M/trunc &&
  is "$(stat -c %s $M/trunc)" 3000000
}
chmod_() { chmod 640 $M/renamed.txt && is "$(stat -c %a $M/renamed.txt)" 640; }
# Writes past the end of a file: the gap reads as zeros.
sparse() {
  dd if=/tmp/patch of=$M/sparse bs=1000 seek=3000 count=70 2>/dev/null &&
  is "$(stat -c %s $M/sparse)" 3070000
}
# Removes a file still open and writes through it: the kernel renames it
# to .nfsXXXX and removes that at close.
silly_rename() {
  exec 4<>$M/held && echo "still here" >&4 && rm $M/held && [ ! -e $M/held ] &&
  is "$(ls -a $M | grep -c '^\.nfs')" 1 && echo "and more" >&4 && exec 4>&- &&
  i=0 && while [ "$(ls -a $M | grep -c '^\.nfs')" != 0 ] && [ $i -lt 50 ]; do usleep 100000; i=$((i+1)); done &&
  is "$(ls -a $M | grep -c '^\.nfs')" 0
}
# Runs the shell command $1 as user (uid 1000, /etc/passwd in the initramfs).
as_user() { su -s /bin/sh user -c "$1"; }
# As uid 1000: writes a file, sets its mtime, makes it read-only (as git
# does with its objects, and cp -p, tar and rsync with mtimes).
user_files() {
  mkdir $M/user && chown 1000:1000 $M/user &&
  as_user "dd if=/tmp/odd of=$M/user/object bs=64k 2>/dev/null" &&
  { [ "$(arg set_mtime)" != 1 ] || as_user "touch -d '2001-09-09 01:46:40' $M/user/object"; } &&
  as_user "chmod 444 $M/user/object" &&
  as_user "echo mine > $M/user/notes" &&
  is "$(stat -c '%u %g %a' $M/user/object)" "1000 1000 444" && mtime_set
}
mtime_set() {
  [ "$(arg set_mtime)" != 1 ] || is "$(stat -c %Y $M/user/object)" 1000000000
}
user_read() {
  as_user "cat $M/user/object" > /tmp/object.back && same /tmp/object.back /tmp/odd &&
  is "$(stat -c '%u %g %a' $M/user/object)" "1000 1000 444" && mtime_set &&
  is "$(as_user "cat $M/user/notes")" mine
}
remove() {
  echo x > $M/gone && rm $M/gone && [ ! -e $M/gone ] &&
  mkdir $M/gonedir && rmdir $M/gonedir && [ ! -e $M/gonedir ]
}
many() {
  mkdir $M/many && i=1 &&
  while [ $i -le 300 ]; do echo "entry $i" > $M/many/f$i || return 1; i=$((i+1)); done
}
count() {
  is "$(ls $M/many | wc -l)" 300 && is "$(ls -l $M/many | grep -c '^-')" 300 &&
  is "$(cat $M/many/f1)" "entry 1" && is "$(cat $M/many/f300)" "entry 300"
}
verify() {
  same $M/big /tmp/big && same $M/odd /tmp/odd && same $M/trunc /tmp/trunc &&
  same $M/par1 /tmp/big && same $M/par2 /tmp/odd &&
  is "$(cat $M/renamed.txt)" hello && is "$(cat $M/r2)" one && is "$(cat $M/dir/inner)" inner &&
  is "$(cat $M/dir/sub/deep)" deep && is "$(stat -c %h $M/big)" 2 &&
  is "$(readlink $M/big.sym)" big && is "$(stat -c %s $M/empty)" 0 &&
  is "$(stat -c %a $M/renamed.txt)" 640 && same $M/sparse /tmp/sparse && user_read && count
}
# Everything under the mount, one entry line each (md5sum and stat run once
# for all files: one process per file takes seconds under TCG).
manifest() {
  cd $M || return 1
  find . -type f | sort | xargs md5sum > /tmp/sums &&
  find . ! -name . | sort | xargs stat -c '%n %f %a %u %g %s %h' > /tmp/stats &&
  awk 'NR == FNR { md5[$2] = $1; next }
    { kind = substr($2, 1, 1) }
    kind == "8" { print "gvfs-kernel: entry", $1, "file", $3, $4, $5, $6, $7, md5[$1] }
    kind == "4" { print "gvfs-kernel: entry", $1, "dir", $3, $4, $5 }' /tmp/sums /tmp/stats >&3 &&
  find . -type l | while read -r p; do
    say "entry $p symlink $(stat -c '%u %g' "$p") $(readlink "$p")"
  done &&
  { [ "$(arg set_mtime)" != 1 ] || say "mtime ./user/object $(stat -c %Y user/object)"; }
}

# `/init run FUNCTION ARGS...` runs one step's function (under timeout).
if [ "$1" = run ]; then shift; "$@"; exit; fi

fails=0
finish() {
  say "end $fails"
  sync
  reboot -f
}
# step NAME COMMAND...: runs COMMAND (a function above or a program) and
# reports ok, or fail with what it printed.
step() {
  name=$1; shift
  out=$(timeout -s KILL $STEP_TIMEOUT /init run "$@" 2>&1)
  rc=$?
  if [ $rc = 0 ]; then say "step $name ok"; return 0; fi
  fails=$((fails+1))
  if [ $rc = 137 ]; then out="killed after ${STEP_TIMEOUT}s: $out"; fi
  say "step $name fail $(echo "$out" | tr '\n' ' ' | cut -c1-500)"
  if [ $rc = 137 ]; then finish; fi
  return 1
}

/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp $M
exec 3>/dev/ttyS1
for m in @MODULES@; do step insmod-$m insmod /lib/modules/$m.ko; done
i=0
while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 200 ]; do usleep 50000; i=$((i+1)); done
step network sh -c 'ifconfig lo 127.0.0.1 up && ifconfig eth0 10.0.2.15 netmask 255.255.255.0 up'
step mount nfs_mount || finish

# What the guest writes, kept in RAM to check what it reads back.
dd if=/dev/urandom of=/tmp/big bs=1M count=6 2>/dev/null
dd if=/dev/urandom of=/tmp/odd bs=1000 count=1337 2>/dev/null
dd if=/dev/urandom of=/tmp/patch bs=1000 count=70 2>/dev/null

step create create
step write-big dd if=/tmp/big of=$M/big bs=1M
step write-odd dd if=/tmp/odd of=$M/odd bs=4096
step patch patch $M
patch /tmp
step drop-caches drop
step read-big same $M/big /tmp/big
step read-odd same $M/odd /tmp/odd
step parallel parallel
step rename rename
step rename-over rename_over
step move-dir move_dir
step hardlink hardlink
step symlink symlink
step unlink-link unlink_link
head -c 2500000 /tmp/big > /tmp/trunc && truncate -s 3000000 /tmp/trunc
step truncate truncate_
step chmod chmod_
head -c 3000000 /dev/zero > /tmp/sparse && cat /tmp/patch >> /tmp/sparse
step sparse sparse
step silly-rename silly_rename
step user-files user_files
step remove remove
step dir-300 many
step drop-caches-2 drop
step verify verify
step umount umount $M
step remount nfs_mount || finish
step verify-remount verify
step manifest manifest
step umount-final umount $M
finish
