// The model's layers as a table (the layer palette): one row per model layer in model order with its stage,
// chunk, parameters, forward GFLOP and saved activations per sample. Rows are dragged onto the mesh canvas;
// the drag carries the layer range as "application/x-meshstudio-layers" (encodeLayerRange()).
//
// What always holds: rows are exactly the layers of ProjectDocument::config()'s model (none while the model
// section is invalid: sizes are then meaningless); Stage and Chunk are the config's placement (the even split
// when it has none) and empty when the parallel section cannot be partitioned (status() says why); the model
// is rebuilt after every configChanged(), never keeps a copy that is out of step with the document.
#pragma once

#include <QAbstractTableModel>
#include <QString>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

// The snapshot slot needs the metatype declaration (Q_DECLARE_METATYPE) before moc instantiates it.
#include "ui/models/plan_analysis.h"

namespace ms {

class ProjectDocument;

// "emb, b0-b3, head": a short list of layer names (model order), runs of blocks as a range.
QString shortLayerNames(const std::vector<std::string>& names);

class LayerModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column { Layer, Stage, Chunk, Parameters, ForwardGflop, ActivationMib, NUM_COLUMNS };
  enum Role {
    LayerIndexRole = Qt::UserRole,  // int: the layer's index in the model
    StageRole,                      // int: its stage, -1 when unknown
    ChunkRole,                      // int: its chunk within its stage (0, 1, ...), -1 when unknown
    ParamCountRole,                 // qlonglong
  };

  explicit LayerModel(ProjectDocument* doc, QObject* parent = nullptr);

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;
  Qt::ItemFlags flags(const QModelIndex& index) const override;
  QStringList mimeTypes() const override;
  // The selected rows' range: first and last layer (a non-contiguous selection gives its min..max).
  QMimeData* mimeData(const QModelIndexList& indexes) const override;
  // Copy only: a drop places layers, it never takes rows away from the palette.
  Qt::DropActions supportedDragActions() const override { return Qt::CopyAction; }

  static QString mimeType() { return QStringLiteral("application/x-meshstudio-layers"); }
  static QByteArray encodeLayerRange(int first, int last);
  // The range, or nothing when the payload is not one (wrong size, bad magic, negative or reversed).
  static std::optional<std::pair<int, int>> decodeLayerRange(const QByteArray& payload);

  // Why Stage and Chunk are empty, or why there are no rows; empty when all is well.
  QString status() const { return m_status; }

 public slots:
  // A plan analysis of the document's config: adds the layers' compute times to the tooltips. Ignored when
  // it is for another config than the current one (the analysis lags the edits).
  void setSnapshot(std::shared_ptr<const ms::PlanSnapshot> snapshot);

 private:
  struct Row {
    QString name;
    qint64 params = 0;
    double gflop = 0;  // forward, per sample
    double mib = 0;    // saved activations, per sample
    int stage = -1;
    int chunk = -1;
    double forwardMs = -1;  // per microbatch on its stage's device, from the snapshot; < 0 unknown
    double backwardMs = -1;
    QString kernels;  // the forward kernel by kernel where the device times them by shape (cost_model.h)
  };
  void rebuild();
  ProjectDocument* m_doc;
  std::vector<Row> m_rows;
  QString m_status;
};

}  // namespace ms
