// How far a watch's reader may fall behind (server/watch_calls.h).
#ifndef SONDE_SERVER_WATCH_OPTIONS_H_
#define SONDE_SERVER_WATCH_OPTIONS_H_

#include <cstddef>

namespace sonde::server {

struct WatchOptions {
  // Delivered steps a WatchSteps call holds unwritten before it ends with
  // RESOURCE_EXHAUSTED (naming the step to resume from).
  size_t max_queued_steps = 256;
};

}  // namespace sonde::server

#endif  // SONDE_SERVER_WATCH_OPTIONS_H_
