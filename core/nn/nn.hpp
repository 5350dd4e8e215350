// The Gluon-style layers of core/nn in one include: Block, the leaf layers, Sequential, and d2l's
// Residual / resnet_block.
#pragma once
#include "core/nn/activation.hpp"
#include "core/nn/batch_norm.hpp"
#include "core/nn/block.hpp"
#include "core/nn/conv2d.hpp"
#include "core/nn/dense.hpp"
#include "core/nn/flatten.hpp"
#include "core/nn/pooling.hpp"
#include "core/nn/residual.hpp"
#include "core/nn/sequential.hpp"
#include "core/nn/sync_batch_norm.hpp"
