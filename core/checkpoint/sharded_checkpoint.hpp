// Sharded checkpoints for ZeRO over the ranks, laid out as torch.distributed.checkpoint lays them
// out: a file per rank plus a metadata file. In `dir`:
//   rank-<r>-of-<W>.safetensors   rank r's part of the optimizer state: the trainable parameters (the
//                                 Trainer's order) end to end are one flat vector of P elements, cut
//                                 by dist::chunk_begin (rank r: [P r / W, P (r+1) / W), the chunk
//                                 ZeRO-1 and ZeRO-2 keep). For every parameter overlapping the chunk
//                                 and every slot of trainer.state_names(), the overlap [a, b) of that
//                                 parameter (offsets inside it) as an F32 tensor "<slot>/<name>/<a>".
//                                 Its __metadata__: format, version, rank, world, step, run (a token
//                                 drawn at each save), parameters (how many). Every rank writes its
//                                 file at every stage; at stage 0 (state replicated) and in a world of
//                                 one the same split applies (one process: one file holding everything).
//   parameters.safetensors        the parameters (save_parameters' file, running statistics included),
//                                 written once by rank 0: at stages 0 to 2 every rank holds them whole;
//                                 at stage 3 the trainable ones are read from the shards first (an
//                                 all-gather); its size and checksum are in the index too.
//   index.json                    written by rank 0 LAST, after every file is written and a barrier:
//                                 format "d2l-sharded-checkpoint", version 1, world, step (num_update),
//                                 learning_rate, epoch, run, the flat layout (parameter names and sizes,
//                                 the chunk bounds per rank), and per file its name, byte size and
//                                 FNV-1a 64 checksum. Rank 0 removes an old index.json before any file
//                                 is written, so a save that dies midway leaves no index at all, never
//                                 one that points at half-written files. Every file is written
//                                 atomically (core/io/atomic_file.hpp).
// At ZeRO-1 and ZeRO-2 over the ranks each rank writes the chunk it keeps, with no all-gather
// (RankShards::chunk_state); at stage 0, before the first step, or with a loaded state not yet
// placed, the state comes from Trainer::state_dict() (then gathered; so at stage 3, whose chunks are
// per unit, not of the one flat vector).
//
// On the dp x tp grid (the Trainer's dp_group smaller than the world, with a tp_group) each tp slice
// holds its own part of every split layer, so each is a checkpoint of its own: tp slice t of T writes
// the files above into dir/tp-<t>-of-<T>/, over its dp group (rank r of W there is its place in the dp
// group; its group's rank 0 writes the parameters and the index). Every slice's files carry the same
// run token, and a load whose slices come from different saves is refused. Resuming reshards within a
// slice (another dp size); the tp size must be the save's (another one finds no tp-<t>-of-<T>). A dp
// group smaller than the world without a tp_group is refused.
//
// Loading is a collective. Every rank reads index.json and EVERY file (simple, and fine for a
// teaching framework's sizes) and checks everything before anything changes: format and version, the
// parameter names and sizes against this net, the layout, each rank's file present, not truncated,
// of this save (its step and run agree with the index: "stale: step 40 in the index, 20 in the
// file"), its size and checksum, holding exactly the tensors it should, finite; the parameters
// file's size and checksum, and its tensors as load_parameters checks them. Any problem on any rank
// reaches every rank (the messages are gathered) and every rank throws the same one-line ConfigError
// naming the file ("checkpoint ck/rank-1-of-2.safetensors: missing"). Then the unsharded state goes
// through Trainer::load_state_dict, which a sharded Trainer places into its own chunks at its next
// step, at any number of ranks and any stage: that is the resharding. At stage 3 with the net already
// sharded (FullyShardedDataParallel made), each rank writes its part of the trainable parameters
// into its shards (Shards::set_parameters); before, they go into the replicas, which the sharding
// then takes. Returns the epoch.
#pragma once
#include <cstdint>
#include <string>

#include "core/nn/block.hpp"
#include "core/optim/trainer.hpp"

namespace d2l::io {

void save_sharded_checkpoint(const std::string& dir, const nn::Block& net, const optim::Trainer& trainer, int64_t epoch);

int64_t load_sharded_checkpoint(const std::string& dir, nn::Block& net, optim::Trainer& trainer);

}  // namespace d2l::io
