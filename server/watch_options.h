// How far a watch's reader may fall behind, and how big its messages get (server/watch_calls.h).
#ifndef SONDE_SERVER_WATCH_OPTIONS_H_
#define SONDE_SERVER_WATCH_OPTIONS_H_

#include <cstddef>

namespace sonde::server {

struct WatchOptions {
  // Delivered steps a WatchSteps call holds unwritten before it ends with
  // RESOURCE_EXHAUSTED (naming the step to resume from).
  size_t max_queued_steps = 256;
  // A step whose records pass this many bytes goes in parts (gRPC's
  // default receive limit is 4 MiB, the collector sends at most 5 MiB).
  size_t max_part_bytes = size_t{3} << 20;
};

}  // namespace sonde::server

#endif  // SONDE_SERVER_WATCH_OPTIONS_H_
