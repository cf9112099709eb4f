package relayconn

import "syscall"

type syscallRawConn = syscall.RawConn
